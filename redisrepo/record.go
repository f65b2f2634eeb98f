package redisrepo

import (
	"fmt"
	"time"

	"github.com/idemkit/idempotency/coordinator"
)

// formatVersion is the version of the record format that this package
// writes, the value of the HASH field "v". The scripts (record.lua) read
// only this version: a record of any other version is unreadable.
const formatVersion = "1"

// The states as the scripts report them. They are the values of
// coordinator.State, so that a reply maps one to one; TestStateCodes keeps
// the two in step.
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
	rec := coordinator.Record{Token: token, Fingerprint: fp}
	switch code {
	case codePending:
		rec.State = coordinator.StatePending
	case codeCompleted:
		rec.State = coordinator.StateCompleted
		rec.Result = []byte(result)
	case codeUnreadable:
		rec.State = coordinator.StateUnreadable
	default:
		return coordinator.Record{}, fmt.Errorf("redisrepo: unexpected record state %d in script reply", code)
	}
	if pttl > 0 {
		rec.TTL = time.Duration(pttl) * time.Millisecond
	}
	return rec, nil
}
