package redisrepo

import (
	"encoding/hex"
	"fmt"
	"slices"
	"time"
	"unsafe"

	"github.com/idemkit/idempotency/coordinator/idemstore"
)

// This file is the record format. Format version 2, which this package
// writes, is one STRING per key (docs/architecture.md, "The record"):
//
//	offset  size  field
//	0       1     format version: 0x02
//	1       1     state: 0x01 pending, 0x02 completed, 0x04 not replayable
//	              (completed, but the result could not be kept: the reason
//	              is stored where a result goes)
//	2       1     flags: 0x01 waiters (a pending record that a caller in some
//	              process waits on: its completion or release publishes the
//	              key), 0x02 token packed, 0x04 fingerprint packed
//	3       1     T, the length of the stored token in bytes
//	4       2     F, the length of the stored fingerprint in bytes, big endian
//	6       T     the owner token
//	6+T     F     the fingerprint
//	6+T+F   rest  the result (completed), the reason (not replayable)
//
// A token or a fingerprint that is an even number of lowercase hex digits (as
// the coordinator's tokens and Fingerprint's fingerprints are) is stored
// packed, as the bytes it spells, and its flag is set: half the size.
//
// Format version 1 is a HASH (record.lua). This package still reads it, so
// that records written before an upgrade replay, but never writes it.

// formatVersion is the format version this package writes; the first byte
// of every record it writes.
const formatVersion = 2

// legacyVersion is the format version of the HASH records this package
// reads but no longer writes. It is the scripts' VERSION: scripts.go writes
// it into their prelude.
const legacyVersion = "1"

// The header of a version 2 record.
const (
	headerLen = 6

	statePending       = byte(idemstore.StatePending)
	stateCompleted     = byte(idemstore.StateCompleted)
	stateNotReplayable = byte(idemstore.StateNotReplayable)

	flagWaiters  = 0x01
	flagTokenHex = 0x02
	flagFPHex    = 0x04

	// maxField is the longest token or fingerprint, as stored.
	maxToken       = 0xff
	maxFingerprint = 0xffff
)

// The states as the scripts report them. They are the values of
// idemstore.State, so that a reply maps one to one, and the scripts'
// ABSENT, PENDING, COMPLETED, UNREADABLE and NOT_REPLAYABLE: scripts.go
// writes them into their prelude, so Go and Lua cannot disagree.
const (
	codeAbsent        = int64(idemstore.StateAbsent)
	codePending       = int64(idemstore.StatePending)
	codeCompleted     = int64(idemstore.StateCompleted)
	codeUnreadable    = int64(idemstore.StateUnreadable)
	codeNotReplayable = int64(idemstore.StateNotReplayable)
)

// hasResult reports whether a record in state st stores bytes after its
// fingerprint: the result of a completed record, the reason of a
// not-replayable one.
func hasResult(st byte) bool { return st == stateCompleted || st == stateNotReplayable }

// knownState reports whether st is a state byte of format 2.
func knownState(st byte) bool { return st == statePending || hasResult(st) }

// packable reports whether s is a non-empty, even number of lowercase hex
// digits, which a record stores packed.
func packable(s string) bool {
	if s == "" || len(s)%2 != 0 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// fieldLen returns the stored length of s, and whether it is packed.
func fieldLen(s string) (int, bool) {
	if packable(s) {
		return len(s) / 2, true
	}
	return len(s), false
}

// appendField appends s as a record stores it.
func appendField(b []byte, s string, packed bool) []byte {
	if !packed {
		return append(b, s...)
	}
	n := len(b)
	b = append(b, make([]byte, len(s)/2)...)
	_, _ = hex.Decode(b[n:], unsafe.Slice(unsafe.StringData(s), len(s))) // packable: never fails
	return b
}

// storedToken returns token as a version 2 record stores it: what the owner
// scripts compare with the record's token field.
func storedToken(token string) string {
	var buf [maxToken]byte
	b, packed := appendStoredToken(buf[:0], token)
	if !packed {
		return token
	}
	return string(b)
}

// appendStoredToken appends token packed, as a version 2 record stores it,
// and reports true; or reports false when the record stores it as it is.
func appendStoredToken(dst []byte, token string) ([]byte, bool) {
	if !packable(token) || len(token)/2 > maxToken {
		return dst, false
	}
	return appendField(dst, token, true), true
}

// encodeRecord returns the version 2 record of state st with token, fp and
// (completed and not-replayable records) result. It returns an error when the token or the
// fingerprint is too long to store.
func encodeRecord(st idemstore.State, token, fp string, result []byte) ([]byte, error) {
	return appendRecord(nil, st, token, fp, result)
}

// appendRecord is encodeRecord appending to dst; it grows dst at most once.
func appendRecord(dst []byte, st idemstore.State, token, fp string, result []byte) ([]byte, error) {
	tl, tp := fieldLen(token)
	fl, fpp := fieldLen(fp)
	if tl > maxToken {
		return nil, fmt.Errorf("redisrepo: token of %d bytes is longer than %d", len(token), maxToken)
	}
	if fl > maxFingerprint {
		return nil, fmt.Errorf("redisrepo: fingerprint of %d bytes is longer than %d", len(fp), maxFingerprint)
	}
	var flags byte
	if tp {
		flags |= flagTokenHex
	}
	if fpp {
		flags |= flagFPHex
	}
	n := headerLen + tl + fl
	if hasResult(byte(st)) {
		n += len(result)
	}
	b := slices.Grow(dst, n)
	b = append(b, formatVersion, byte(st), flags, byte(tl), byte(fl>>8), byte(fl))
	b = appendField(b, token, tp)
	b = appendField(b, fp, fpp)
	if hasResult(byte(st)) {
		b = append(b, result...)
	}
	return b, nil
}

// decodeValue reads v, a STRING value under a record's key. A value that is
// not a version 2 record is a Record with StateUnreadable (and token ""),
// not an error: the coordinator heals it. The result aliases v, and so does
// the fingerprint when it is not packed: v comes fresh from a reply, has no
// other user and is never changed, so nothing is copied.
func decodeValue(v []byte) idemstore.Record {
	rec, _ := decodeValueIn(v, nil)
	return rec
}

// decodeValueIn is decodeValue, spelling a packed token and fingerprint
// into spell when it has room for both (else into an allocation of their
// own). It returns how many bytes of spell it used.
func decodeValueIn(v, spell []byte) (idemstore.Record, int) {
	if len(v) < headerLen || v[0] != formatVersion {
		return idemstore.Record{State: idemstore.StateUnreadable}, 0
	}
	st, flags := v[1], v[2]
	tl := int(v[3])
	fl := int(v[4])<<8 | int(v[5])
	end := headerLen + tl + fl
	if len(v) < end || !knownState(st) || (st == statePending && len(v) != end) {
		return idemstore.Record{State: idemstore.StateUnreadable}, 0
	}
	token, fp := v[headerLen:headerLen+tl], v[headerLen+tl:end]
	tp, fpp := flags&flagTokenHex != 0, flags&flagFPHex != 0
	var spelled []byte // the packed fields spelled in hex: one buffer for both
	used := 0
	switch n := packedLen(token, tp) + packedLen(fp, fpp); {
	case n == 0:
	case n <= cap(spell):
		spelled, used = spell[:0:n], n
	default:
		spelled = make([]byte, 0, n)
	}
	rec := idemstore.Record{State: idemstore.State(st)}
	rec.Token, spelled = field(token, tp, spelled)
	rec.Fingerprint, _ = field(fp, fpp, spelled)
	if hasResult(st) {
		rec.Result = v[end:len(v):len(v)]
	}
	return rec, used
}

// packedLen returns the length of b, a stored field, spelled in hex when it
// is packed, else 0.
func packedLen(b []byte, packed bool) int {
	if !packed {
		return 0
	}
	return hex.EncodedLen(len(b))
}

// field returns b, a stored token or fingerprint, as it was given, and the
// rest of spell: a packed field is spelled into spell, which has room for it
// (see packedLen), and aliases it; else it aliases b.
func field(b []byte, packed bool, spell []byte) (string, []byte) {
	if packed && len(b) > 0 {
		n := hex.EncodedLen(len(b))
		h := spell[:n]
		hex.Encode(h, b)
		return unsafe.String(&h[0], n), spell[n:n:cap(spell)]
	}
	if len(b) == 0 {
		return "", spell
	}
	return unsafe.String(&b[0], len(b)), spell
}

// decodeLegacy turns the reply {state, token, fingerprint, result, pttl} of
// legacy.lua, which reads format version 1 records, into a Record. The
// script has already judged what is under the key, so a reply of another
// shape is not a record that cannot be read: it is a protocol error (a wrong
// script, a proxy in the way) and is returned as one.
func decodeLegacy(v any) (idemstore.Record, error) {
	a, ok := v.([]any)
	if !ok || len(a) != 5 {
		return idemstore.Record{}, fmt.Errorf("redisrepo: unexpected script reply %T", v)
	}
	code, ok1 := a[0].(int64)
	token, ok2 := a[1].(string)
	fp, ok3 := a[2].(string)
	result, ok4 := a[3].(string)
	pttl, ok5 := a[4].(int64)
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 {
		return idemstore.Record{}, fmt.Errorf("redisrepo: unexpected script reply %v", a)
	}
	state, ok := decodeState(code)
	if !ok {
		return idemstore.Record{}, fmt.Errorf("redisrepo: unexpected record state %d in script reply", code)
	}
	if state == idemstore.StateAbsent {
		return idemstore.Record{}, nil
	}
	rec := idemstore.Record{State: state, Token: token, Fingerprint: fp}
	if state == idemstore.StateCompleted || state == idemstore.StateNotReplayable {
		rec.Result = []byte(result)
	}
	if pttl > 0 {
		rec.TTL = time.Duration(pttl) * time.Millisecond
	}
	return rec, nil
}

// decodeState returns the state that a state code of a script reply stands
// for, and false for a code that stands for none. It is the one decoding of
// the codes, for decodeLegacy and decodeInfo.
func decodeState(code int64) (idemstore.State, bool) {
	if code < codeAbsent || code > codeNotReplayable {
		return 0, false
	}
	return idemstore.State(code), true
}
