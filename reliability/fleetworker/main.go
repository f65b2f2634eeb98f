// Command fleetworker is one process of the reliability suite's fleet
// storms (reliability/fleet_test.go): an fx app with idempotency.Module,
// configured by its IDEMPOTENCY_* environment as a service of a real fleet
// is, that makes the calls its driver sends on standard input and reports on
// standard output what happened to each, one JSON object a line.
//
// It uses only the library's public API that every release since format 2
// has, so that the suite can build it against an earlier commit of this
// repository too (a rolling upgrade and its rollback).
//
// Input, one call a line: "id op key fp maxActionMicros cancellable own".
// Output: {"t":"ready"} once started; per call "invoked" (the action
// started, with its reservation), "effect" (the action made its effect:
// written before the action returns, so that a kill -9 cannot lose it) or
// "cancelled" (its context ended first),
// "done" (Do returned) and "event" (what the coordinator's observer reported
// for the call); {"t":"count"} for failed store calls and errors; and
// {"t":"bye"} after a graceful stop (SIGTERM, or the end of the input),
// when the coordinator has finished its background saves and releases.
// Times are the wall clock in nanoseconds, which every process of one
// machine shares.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/fx"
	"go.uber.org/zap"

	idempotency "github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/coordinator"
)

// line is one line of output.
type line struct {
	T         string `json:"t"`
	ID        int    `json:"id,omitempty"`
	At        int64  `json:"at,omitempty"`
	Start     int64  `json:"start,omitempty"`
	End       int64  `json:"end,omitempty"`
	Value     string `json:"value,omitempty"`
	Class     string `json:"class,omitempty"`
	Err       string `json:"err,omitempty"`
	Protected bool   `json:"protected,omitempty"`
	Token     string `json:"token,omitempty"`
	Fence     uint64 `json:"fence,omitempty"`
	Event     string `json:"event,omitempty"`
	Pid       int    `json:"pid,omitempty"`
}

// out writes whole lines to standard output, one write each, so that lines
// of concurrent calls never interleave and a line written survives a kill.
type out struct{ mu sync.Mutex }

func (o *out) put(l line) {
	b, err := json.Marshal(l)
	if err != nil {
		panic(err)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	_, _ = os.Stdout.Write(append(b, '\n'))
}

func now() int64 { return time.Now().UnixNano() }

// callKey carries the call's id in the context of its Do, for the observer.
type callKey struct{}

// observer reports the events the suite's checker needs, by call.
type observer struct{ o *out }

func (ob observer) Observe(ctx context.Context, e event) {
	id, _ := ctx.Value(callKey{}).(int)
	var name string
	switch e.Kind {
	case kindUnprotected:
		name = "unprotected"
	case kindStored:
		name = "stored"
	case kindError:
		name = string(e.ErrorType)
	case kindStorageCall:
		if e.Err == nil {
			return
		}
		ob.o.put(line{T: "count", Event: "failed_store_call"})
		return
	default:
		return
	}
	l := line{T: "event", ID: id, Event: name, At: now()}
	if e.Err != nil {
		l.Err = e.Err.Error()
	}
	if id == 0 {
		l.T = "count"
	}
	ob.o.put(l)
}

// classify names how a call ended, as the suite's checker does.
func classify(err error) string {
	switch {
	case err == nil:
		return "value"
	case errors.Is(err, coordinator.ErrInProgress):
		return "in_progress"
	case errors.Is(err, coordinator.ErrStorage):
		return "storage"
	case errors.Is(err, coordinator.ErrKeyReuse):
		return "key_reuse"
	case errors.Is(err, coordinator.ErrLeaseLost):
		return "lease_lost"
	case errors.Is(err, coordinator.ErrNotReplayable):
		return "not_replayable"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return "context"
	}
	return "other"
}

// callDeadline is the deadline of a call whose context can end: far beyond
// any documented bound, so that one that reaches it is a hang.
const callDeadline = 20 * time.Second

func main() {
	o := &out{}
	var co *coordinator.Coordinator
	app := fx.New(
		fx.NopLogger,
		fx.Supply(zap.NewNop()),
		idempotency.Module,
		fx.Provide(fx.Annotate(func() eventObserver { return observer{o} },
			fx.ResultTags(`group:"`+idempotency.ObserversGroup+`"`))),
		fx.Populate(&co),
	)
	if err := app.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "fleetworker:", err)
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	if err := app.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "fleetworker: start:", err)
		os.Exit(2)
	}
	cancel()
	o.put(line{T: "ready", Pid: os.Getpid()})

	// SIGTERM: stop reading, let the calls in flight finish, stop the app.
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var wg sync.WaitGroup
loop:
	for {
		select {
		case <-term:
			break loop
		case l, ok := <-lines:
			if !ok {
				break loop
			}
			f := strings.Fields(l)
			if len(f) != 7 {
				fmt.Fprintf(os.Stderr, "fleetworker: bad input %q\n", l)
				os.Exit(2)
			}
			id, _ := strconv.Atoi(f[0])
			maxAction, _ := strconv.ParseInt(f[4], 10, 64)
			wg.Add(1)
			go func() {
				defer wg.Done()
				do(o, co, id, f[1], f[2], f[3], time.Duration(maxAction)*time.Microsecond, f[5] == "1", f[6])
			}()
		}
	}
	wg.Wait()
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := app.Stop(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "fleetworker: stop:", err)
	}
	o.put(line{T: "bye"})
}

// do makes one call and reports it. Its action sleeps up to maxAction (or
// until its context ends), then makes its effect and returns own.
func do(o *out, co *coordinator.Coordinator, id int, op, key, fp string, maxAction time.Duration, cancellable bool, own string) {
	ctx := context.WithValue(context.Background(), callKey{}, id)
	if cancellable {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, callDeadline)
		defer cancel()
	}
	if fp == "-" {
		fp = ""
	}
	start := now()
	v, err := coordinator.Do(ctx, co, coordinator.Call{Operation: op, Key: key, Fingerprint: fp}, func(ctx context.Context) (string, error) {
		res, ok := coordinator.ReservationFromContext(ctx)
		o.put(line{T: "invoked", ID: id, At: now(), Protected: ok, Token: res.Token, Fence: res.Fence})
		if d := time.Duration(rand.Int64N(int64(maxAction) + 1)); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
		}
		if ctx.Err() != nil {
			o.put(line{T: "cancelled", ID: id, At: now()})
			return "", context.Cause(ctx)
		}
		o.put(line{T: "effect", ID: id, At: now()})
		return own, nil
	})
	l := line{T: "done", ID: id, Start: start, End: now(), Class: classify(err)}
	if err != nil {
		l.Err = err.Error()
	} else {
		l.Value = v
	}
	o.put(l)
}
