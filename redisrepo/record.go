package redisrepo

import (
	"fmt"
	"time"

	"github.com/idemkit/idempotency/coordinator"
)

// formatVersion is the version of the record format that this package
// writes, the value of the HASH field "v". The scripts (record.lua) read
// only this version: a record of any other version is unreadable. It is the
// scripts' VERSION: scripts.go writes it into their prelude.
const formatVersion = "1"

// The states as the scripts report them. They are the values of
// coordinator.State, so that a reply maps one to one, and the scripts'
// ABSENT, PENDING, COMPLETED and UNREADABLE: scripts.go writes them into
// their prelude, so Go and Lua cannot disagree.
const (
	codeAbsent     = int64(coordinator.StateAbsent)
	codePending    = int64(coordinator.StatePending)
	codeCompleted  = int64(coordinator.StateCompleted)
	codeUnreadable = int64(coordinator.StateUnreadable)
)

// decodeRecord turns the reply {state, token, fingerprint, result, pttl} of
// reserve.lua and get.lua into a Record. The scripts have already judged
// what is under the key, so a reply of another shape is not a record that
// cannot be read: it is a protocol error (a wrong script, a proxy in the way)
// and is returned as one.
func decodeRecord(v any) (coordinator.Record, error) {
	a, ok := v.([]any)
	if !ok || len(a) != 5 {
		return coordinator.Record{}, fmt.Errorf("redisrepo: unexpected script reply %T", v)
	}
	code, ok1 := a[0].(int64)
	token, ok2 := a[1].(string)
	fp, ok3 := a[2].(string)
	result, ok4 := a[3].(string)
	pttl, ok5 := a[4].(int64)
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 {
		return coordinator.Record{}, fmt.Errorf("redisrepo: unexpected script reply %v", a)
	}
	state, ok := decodeState(code)
	if !ok || state == coordinator.StateAbsent {
		return coordinator.Record{}, fmt.Errorf("redisrepo: unexpected record state %d in script reply", code)
	}
	rec := coordinator.Record{State: state, Token: token, Fingerprint: fp}
	if state == coordinator.StateCompleted {
		rec.Result = []byte(result)
	}
	if pttl > 0 {
		rec.TTL = time.Duration(pttl) * time.Millisecond
	}
	return rec, nil
}

// decodeState returns the state that a state code of a script reply stands
// for, and false for a code that stands for none. It is the one decoding of
// the codes, for decodeRecord and decodeInfo.
func decodeState(code int64) (coordinator.State, bool) {
	if code < codeAbsent || code > codeUnreadable {
		return 0, false
	}
	return coordinator.State(code), true
}
