package reliability_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/idemkit/idempotency/coordinator"
)

// A history is what a storm recorded: every call, as an operation with its
// call and return times on one monotonic clock, its input (the value its
// action would produce) and its output (the value returned, or the class of
// its error); the effects of the actions; and the windows in which a fault
// may have lost what Redis held.

// errClass is how a call ended, as the checker sees it.
type errClass uint8

const (
	// okValue: the call returned a value.
	okValue errClass = iota
	// errInProgress: ErrInProgress (in-flight mode raise, or past the wait
	// bound).
	errInProgress
	// errStorage: a *StorageError (on-storage-error mode raise).
	errStorage
	// errKeyReuse: ErrKeyReuse (the key holds another fingerprint's call).
	errKeyReuse
	// errLeaseLost: the action was cancelled with cause ErrLeaseLost (the
	// watchdog, or a renewal that found the key gone) and returned it.
	errLeaseLost
	// errContext: the caller's own context ended. The storm gives every
	// call whose context can end a deadline far beyond any documented
	// bound, so this is a hang.
	errContext
	// errOther: anything else. Never expected.
	errOther
	// errNotReplayable: ErrNotReplayable (the key's result was too large to
	// keep for the process that ran it: a fleet with mixed limits).
	errNotReplayable
	// errKilled: the call never returned: its process was killed (kill -9)
	// while it ran. Its end is the moment the process was gone.
	errKilled
)

var errClassNames = [...]string{"value", "in_progress", "storage", "key_reuse", "lease_lost", "context", "other", "not_replayable", "killed"}

func (c errClass) String() string { return errClassNames[c] }

// classify returns the class of what Do returned.
func classify(err error) errClass {
	switch {
	case err == nil:
		return okValue
	case errors.Is(err, coordinator.ErrInProgress):
		return errInProgress
	case errors.Is(err, coordinator.ErrStorage):
		return errStorage
	case errors.Is(err, coordinator.ErrKeyReuse):
		return errKeyReuse
	case errors.Is(err, coordinator.ErrLeaseLost):
		return errLeaseLost
	case errors.Is(err, coordinator.ErrNotReplayable):
		return errNotReplayable
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return errContext
	}
	return errOther
}

// call is one call of a storm: one operation of the history.
type call struct {
	id     int
	client int    // the caller (porcupine's client id)
	op     string // the operation
	key    string // the idempotency key
	fp     string // the fingerprint
	own    string // the value this call's action returns: value(op, key, fp, id)
	final  bool   // a read after the storm, to find lost results
	start  int64  // when Do was called (ns on the storm's clock)
	end    int64  // when it returned

	value    string // what Do returned, when it returned a value
	class    errClass
	err      error
	panicked any // what Do panicked with, if it did
	// modes, when set, are the modes of the process that made the call (a
	// fleet storm's processes differ); else the history's.
	modes *modes

	// Set by the action, on the caller's goroutine.
	invoked   bool   // the action was called
	ran       bool   // the action made its effect and returned own
	protected bool   // it ran under a reservation (ReservationFromContext)
	token     string // the reservation's token
	fence     uint64 // the reservation's fence (fenced storms)
	actStart  int64
	actEnd    int64

	// Set by the observer, possibly from the coordinator's background work
	// after Do returned (read once the coordinator is closed).
	unprotected atomic.Bool // EventUnprotected
	stored      atomic.Bool // EventStored: this call's result was written
	saveFailed  atomic.Bool // storage_save_error
	// saveGivenUp: the coordinator gave the save up, "not stored: the
	// store failed until the reservation could have expired".
	saveGivenUp atomic.Bool
	leaseLost   atomic.Bool // lease_lost
	// unprotectedErr is the store's error that made the run unprotected.
	unprotectedErr atomic.Pointer[error]
	// events is the call's events, "time:name", for the dump of a failing
	// key; guarded by the observer's mutex.
	events []string
}

// storeErr returns the store's error that the call met before its action
// ran: the *StorageError it returned, or the one that made it run
// unprotected; nil when it met none.
func (c *call) storeErr() error {
	if c.class == errStorage {
		return c.err
	}
	if p := c.unprotectedErr.Load(); p != nil {
		return *p
	}
	return nil
}

// isTimeout reports whether err is a timeout: the storage timeout, or a
// socket deadline.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// pkey is the key the checker partitions by: operation and key.
func (c *call) pkey() string { return c.op + ":" + c.key }

// runMode reports whether the call's action ran without a reservation
// because the in-flight mode is run, the store up (an unprotected run in
// mode run is unprotectedRun).
func (h *history) runMode(c *call) bool {
	return c.ran && !c.protected && h.inFlightOf(c) == coordinator.InFlightRun && !c.unprotected.Load()
}

// inFlightOf returns the in-flight mode of the process that made c.
func (h *history) inFlightOf(c *call) coordinator.InFlightMode {
	if c.modes != nil {
		return c.modes.inFlight
	}
	return h.inFlight
}

// onErrorOf returns the on-storage-error mode of the process that made c.
func (h *history) onErrorOf(c *call) coordinator.OnStorageErrorMode {
	if c.modes != nil {
		return c.modes.onError
	}
	return h.onError
}

// unprotectedRun reports whether the call's action ran without a reservation
// because the store failed and on-storage-error is run (the coordinator
// reported it unprotected), or without one in in-flight mode wait or raise
// at all.
func (h *history) unprotectedRun(c *call) bool {
	return c.ran && !c.protected && (h.inFlightOf(c) != coordinator.InFlightRun || c.unprotected.Load())
}

// value returns the value the action of call id on (op, key, fp) produces:
// it names all four, so that a replay of another key's, another operation's
// or another fingerprint's result shows.
func value(op, key, fp string, id int) string {
	return op + "|" + key + "|" + fp + "|" + strconv.Itoa(id)
}

// parseValue splits a value made by value.
func parseValue(v string) (op, key, fp string, id int, ok bool) {
	parts := strings.Split(v, "|")
	if len(parts) != 4 {
		return "", "", "", 0, false
	}
	id, err := strconv.Atoi(parts[3])
	if err != nil {
		return "", "", "", 0, false
	}
	return parts[0], parts[1], parts[2], id, true
}

// lossWindow is a span of time in which Redis may have lost records: a
// server killed and restarted empty (every record is gone: a wipe), or a
// failover (records written shortly before it may be gone).
type lossWindow struct {
	start, end int64
	wipe       bool // every record is lost, not only some
	// spans says that a record written at any time in the window may be
	// lost, not only one written before it began: a Sentinel failover,
	// whose former master takes the writes of clients that have not yet
	// switched until it is reconfigured, and then drops them; a kill -9,
	// which lands some time after the window began (the storm's goroutine
	// that sends it may wait for a core).
	spans  bool
	reason string // why a run after it is allowed, for the report
	// affects reports whether the window concerns a record (by pkey); nil
	// means every record.
	affects func(pkey string) bool
}

func (w lossWindow) covers(pkey string) bool { return w.affects == nil || w.affects(pkey) }

// history is everything a storm recorded.
type history struct {
	inFlight coordinator.InFlightMode
	onError  coordinator.OnStorageErrorMode
	calls    []*call
	windows  []lossWindow
	// effects counts the effects of each key's actions, as the actions
	// counted them (the checker recounts them from the calls and compares).
	effects map[string]int64
	// hangLimit, if set, replaces the default hang limit.
	hangLimit time.Duration
}

// callKey carries the *call in the context of its Do, so that the observer
// can attribute events to it.
type callKey struct{}

// observer records the coordinator's events: on the call they belong to, and
// counted by kind and error type.
type observer struct {
	now func() int64 // the storm's clock
	mu  sync.Mutex
	n   map[string]int
}

func (o *observer) Observe(ctx context.Context, e idemevent.Event) {
	c, _ := ctx.Value(callKey{}).(*call)
	if byKey, ok := ctx.Value(batchCallsKey{}).(map[idemstore.Key]*call); ok {
		c = byKey[e.Key] // nil for a bulk call's event, which has no key
	}
	name := e.Kind.String()
	if c != nil && o.now != nil {
		ev := name
		switch {
		case e.ErrorType != "":
			ev = string(e.ErrorType)
		case e.Kind == idemevent.StorageCall:
			ev = "call:" + string(e.Method)
			if e.Err != nil {
				ev += "!"
			}
		case e.Kind == idemevent.Waited:
			ev += ":" + string(e.Outcome)
		}
		at := time.Duration(o.now()).Round(time.Millisecond)
		o.mu.Lock()
		c.events = append(c.events, at.String()+":"+ev)
		o.mu.Unlock()
	}
	switch e.Kind {
	case idemevent.Unprotected:
		if c != nil {
			c.unprotected.Store(true)
			err := e.Err
			c.unprotectedErr.Store(&err)
		}
	case idemevent.Stored:
		if c != nil {
			c.stored.Store(true)
		}
	case idemevent.Error:
		name = string(e.ErrorType)
		if c != nil {
			switch e.ErrorType {
			case idemevent.ErrorStorageSave:
				c.saveFailed.Store(true)
				if givenUp(e.Err) {
					c.saveGivenUp.Store(true)
				}
			case idemevent.ErrorLeaseLost:
				c.leaseLost.Store(true)
			}
		}
	case idemevent.StorageCall:
		if e.Err == nil {
			return
		}
		name = "failed_store_call"
	case idemevent.Hit, idemevent.Miss, idemevent.Waited:
		return // the history has them
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n == nil {
		o.n = map[string]int{}
	}
	o.n[name]++
	if e.Kind == idemevent.Error && e.ErrorType == idemevent.ErrorStorageSave && givenUp(e.Err) {
		o.n[saveGivenUpEvent]++
	}
}

// saveGivenUpEvent counts the saves the coordinator gave up.
const saveGivenUpEvent = "save_given_up"

// givenUp reports whether err is the coordinator's report of a save given
// up: "not stored: the store failed until the reservation could have
// expired".
func givenUp(err error) bool {
	return err != nil && strings.Contains(err.Error(), "not stored") && strings.Contains(err.Error(), "could have expired")
}

// count returns the count of one event name.
func (o *observer) count(name string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n[name]
}

// counts returns the counted events, sorted by name, as "name=n" words.
func (o *observer) counts() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return formatCounts(o.n)
}

func formatCounts(n map[string]int) string {
	var b strings.Builder
	for _, k := range sortedKeys(n) {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%d", k, n[k])
	}
	return b.String()
}
