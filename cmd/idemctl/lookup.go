package main

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/idemkit/idempotency/coordinator/idemstore"
)

// The encodings of a result: -result-format.
const (
	formatAuto   = "auto"   // text if printable UTF-8, else quoted if UTF-8, else base64
	formatText   = "text"   // as it is when printable, else quoted with Go escapes
	formatHex    = "hex"    // lowercase hex digits
	formatBase64 = "base64" // standard base64, padded
)

// lookupEntry is what lookup reports of one key; its JSON form is lookup
// -json's.
type lookupEntry struct {
	Operation string `json:"operation"`
	// Key is the key as given; StoredKey, with -scope, the scoped key the
	// coordinator sees (idemkey.Scoped), and Scope the scope.
	Key       string  `json:"key"`
	Scope     *string `json:"scope,omitempty"`
	StoredKey string  `json:"stored_key,omitempty"`
	// RedisKey is the Redis key of the record, on Redis; Table the table
	// that holds it, on PostgreSQL.
	RedisKey    string     `json:"redis_key,omitempty"`
	Table       string     `json:"table,omitempty"`
	State       string     `json:"state"`
	TTLMillis   *int64     `json:"ttl_ms"` // null when absent, -1 without an expiry
	CreatedAt   *time.Time `json:"created_at,omitempty"`
	Fingerprint string     `json:"fingerprint"`
	ResultSize  int        `json:"result_size"`
	Token       bool       `json:"token"`
	// Reason is why a not-replayable record's result was not kept.
	Reason string `json:"reason,omitempty"`
	// Result and ResultEncoding are there with -result, for a completed
	// record.
	Result         *string `json:"result,omitempty"`
	ResultEncoding string  `json:"result_encoding,omitempty"`
	// Steps are the steps of an idempg.Steps call that committed, on
	// PostgreSQL: where a call that stopped resumes.
	Steps []stepEntry `json:"steps,omitempty"`

	state idemstore.State
}

// stepEntry is one step of lookupEntry.Steps.
type stepEntry struct {
	Name        string    `json:"name"`
	Kind        string    `json:"kind"`  // "phase" or "outside"
	State       string    `json:"state"` // "done" or "failed"
	Reason      string    `json:"reason,omitempty"`
	CommittedAt time.Time `json:"committed_at"`
}

// lookup describes keys of one operation: the store's Inspect, and its Get
// for the owner token and the result.
func (a *app) lookup(ctx context.Context, args []string) int {
	fs, o := a.newFlagSet("lookup", "lookup [flags] <operation> <key>...")
	asJSON := fs.Bool("json", false, "print a JSON array, one object per key")
	withResult := fs.Bool("result", false, "print the stored result of a completed record too")
	scope := addScopeFlag(fs)
	format := fs.String("result-format", formatAuto, "how to print a result: auto (text if printable UTF-8, else quoted, else base64), text (quoted when not printable), hex or base64")
	rest, err := parse(fs, o, args)
	if err != nil {
		return parseStatus(err)
	}
	switch *format {
	case formatAuto, formatText, formatHex, formatBase64:
	default:
		return a.usageError(fs, "-result-format %q: want auto, text, hex or base64", *format)
	}
	if len(rest) < 2 {
		return a.usageError(fs, "want an operation and at least one key")
	}
	keys, err := parseKeys(rest[0], rest[1:], scope)
	if err != nil {
		return a.usageError(fs, "%v", err)
	}
	c, err := a.connect(ctx, o)
	if err != nil {
		return a.fail("lookup", err)
	}
	defer c.Close()

	entries, err := describe(ctx, c, keys, *withResult, *format, *asJSON)
	if err != nil {
		return a.fail("lookup", err)
	}
	if scope.set {
		for i := range entries {
			entries[i].Key, entries[i].StoredKey, entries[i].Scope = rest[1+i], entries[i].Key, &scope.value
		}
	}
	if *asJSON {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(entries); err != nil {
			return a.fail("lookup", err)
		}
		return exitOK
	}
	for i, e := range entries {
		if i > 0 {
			fmt.Fprintln(a.stdout)
		}
		a.printEntry(e)
	}
	return exitOK
}

// describe returns the entries of keys: one inspect for all, and a get per
// key for the owner token and the result.
func describe(ctx context.Context, r recordStore, keys []idemstore.Key, withResult bool, format string, forJSON bool) ([]lookupEntry, error) {
	entries, err := r.inspect(ctx, keys)
	if err != nil {
		return nil, err
	}
	for i := range entries {
		e := &entries[i]
		switch e.state {
		case idemstore.StatePending, idemstore.StateCompleted, idemstore.StateNotReplayable:
		default:
			continue
		}
		rec, err := r.get(ctx, keys[i])
		if err != nil {
			return nil, err
		}
		// The record may have changed since inspect: what get read wins
		// for the token and the result.
		e.Token = rec.Token != ""
		if rec.State == idemstore.StateNotReplayable {
			e.Reason = string(rec.Result)
		}
		if withResult && rec.State == idemstore.StateCompleted {
			text, enc := encodeResult(rec.Result, format, forJSON)
			e.Result, e.ResultEncoding = &text, enc
		}
	}
	return entries, nil
}

// entryOf returns what inspect says of one key, in either store.
func entryOf(key idemstore.Key, state idemstore.State, ttl time.Duration, created time.Time, fingerprint string, resultSize int) lookupEntry {
	e := lookupEntry{
		Operation:   key.Operation,
		Key:         key.Key,
		State:       state.String(),
		state:       state,
		Fingerprint: fingerprint,
		ResultSize:  resultSize,
	}
	if state != idemstore.StateAbsent {
		ms := ttl.Milliseconds()
		if ttl < 0 {
			ms = -1
		}
		e.TTLMillis = &ms
	}
	if !created.IsZero() {
		t := created.UTC()
		e.CreatedAt = &t
	}
	return e
}

// printEntry prints e as text, every value from Redis made safe for a
// terminal.
func (a *app) printEntry(e lookupEntry) {
	line := func(label, value string) { fmt.Fprintf(a.stdout, "  %-11s  %s\n", label, value) }
	if e.Scope == nil {
		fmt.Fprintf(a.stdout, "%s %s\n", e.Operation, e.Key)
	} else {
		fmt.Fprintf(a.stdout, "%s %s (scope %s)\n", e.Operation, e.Key, strconv.QuoteToASCII(*e.Scope))
		line("stored key", e.StoredKey)
	}
	if e.RedisKey != "" {
		line("redis key", safe(e.RedisKey))
	} else {
		line("table", e.Table)
	}
	line("state", e.State)
	for i, st := range e.Steps {
		label := ""
		if i == 0 {
			label = "steps"
		}
		text := fmt.Sprintf("%s %s %s at %s", safe(st.Name), st.Kind, st.State, st.CommittedAt.Format(time.RFC3339Nano))
		if st.Reason != "" {
			text += ": " + safe(st.Reason)
		}
		line(label, text)
	}
	if e.State == idemstore.StateAbsent.String() {
		if len(e.Steps) > 0 {
			line("note", "no record: the call stopped after the steps above, and a retry resumes after them")
			return
		}
		if e.Table != "" {
			line("note", "a key whose first run is in progress is absent until its transaction commits")
		}
		return
	}
	ttl := "none (the key never expires)"
	if *e.TTLMillis >= 0 {
		ttl = (time.Duration(*e.TTLMillis) * time.Millisecond).String()
	}
	line("ttl", ttl)
	if e.CreatedAt != nil {
		line("created", e.CreatedAt.Format(time.RFC3339Nano))
	}
	fp := "none"
	if e.Fingerprint != "" {
		fp = safe(e.Fingerprint)
	}
	line("fingerprint", fp)
	token := "absent"
	if e.Token {
		token = "present"
	}
	line("owner token", token)
	if e.State == idemstore.StateNotReplayable.String() {
		line("reason", safe(e.Reason))
	}
	if e.State == idemstore.StateCompleted.String() {
		line("result size", plural(e.ResultSize, "byte"))
		if e.Result != nil {
			line("result", e.ResultEncoding+": "+*e.Result)
		}
	}
}

// encodeResult returns result encoded as format says, and the name of the
// encoding it used: "text" (as it is), "quoted" (a Go string literal, whose
// escapes keep control characters off the terminal), "hex" or "base64". For
// JSON, which escapes what needs it, any UTF-8 is text, and text that is not
// UTF-8 is base64 (JSON would replace its bytes).
func encodeResult(result []byte, format string, forJSON bool) (string, string) {
	s := string(result)
	switch format {
	case formatHex:
		return hex.EncodeToString(result), formatHex
	case formatBase64:
		return base64.StdEncoding.EncodeToString(result), formatBase64
	}
	valid := utf8.Valid(result)
	switch {
	case forJSON && valid:
		return s, formatText
	case forJSON:
		return base64.StdEncoding.EncodeToString(result), formatBase64
	case printable(s):
		return s, formatText
	case format == formatText || valid:
		return strconv.Quote(s), "quoted"
	}
	return base64.StdEncoding.EncodeToString(result), formatBase64
}
