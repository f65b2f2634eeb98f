package coalesce

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/internal/redistest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(redistest.Main(m))
}

// fake is a Redis that a hook plays: no command leaves the process. ECHO
// replies with its argument. It counts the commands sent alone and the
// pipelines, and can hold the commands sent alone, or fail pipelines.
type fake struct {
	mu        sync.Mutex
	alone     int
	pipelines []int // the size of each
	hold      chan struct{}
	held      chan struct{} // receives once per command held
	failPipes error
	holdPipes chan struct{} // a pipeline waits until it is closed
	heldPipe  chan struct{} // receives once per pipeline held
	// pipeDeadline is the deadline of the last pipeline.
	pipeDeadline time.Time
}

func newFake(t *testing.T) (*fake, *redis.Client) {
	t.Helper()
	f := &fake{}
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	c.AddHook(f)
	t.Cleanup(func() { _ = c.Close() })
	return f, c
}

func (f *fake) DialHook(next redis.DialHook) redis.DialHook { return next }

func (f *fake) ProcessHook(redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		f.mu.Lock()
		f.alone++
		hold, held := f.hold, f.held
		f.mu.Unlock()
		if hold != nil {
			if held != nil {
				held <- struct{}{}
			}
			select {
			case <-hold:
			case <-ctx.Done():
				cmd.SetErr(ctx.Err())
				return ctx.Err()
			}
		}
		reply(cmd, nil)
		return cmd.Err()
	}
}

func (f *fake) ProcessPipelineHook(redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		f.mu.Lock()
		f.pipelines = append(f.pipelines, len(cmds))
		f.pipeDeadline, _ = ctx.Deadline()
		fail, hold, held := f.failPipes, f.holdPipes, f.heldPipe
		f.mu.Unlock()
		if hold != nil {
			held <- struct{}{}
			<-hold
		}
		for _, cmd := range cmds {
			reply(cmd, fail)
		}
		return fail
	}
}

// reply answers cmd, an ECHO, as Redis would, or fails it with err.
func reply(cmd redis.Cmder, err error) {
	if err != nil {
		cmd.SetErr(err)
		return
	}
	arg := cmd.Args()[1].(string)
	switch c := cmd.(type) {
	case *redis.Cmd:
		c.SetVal(arg)
	case *redis.RawCmd:
		c.SetVal([]byte(fmt.Sprintf("$%d\r\n%s\r\n", len(arg), arg)))
	}
}

func (f *fake) counts() (alone int, pipelines []int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.alone, append([]int(nil), f.pipelines...)
}

// queued returns how many commands wait on c's lanes.
func queued(c *Coalescer) int {
	n := 0
	for i := range c.lanes {
		l := &c.lanes[i]
		l.mu.Lock()
		n += len(l.queue)
		l.mu.Unlock()
	}
	return n
}

// waitQueued waits until n commands wait on c's lanes.
func waitQueued(t *testing.T, c *Coalescer, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); queued(c) != n; {
		if time.Now().After(deadline) {
			t.Fatalf("%d commands queued, want %d", queued(c), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func echo(ctx context.Context, c *Coalescer, s string) (string, error) {
	cmd := redis.NewCmd(ctx, "echo", s)
	err := c.ProcessUncopied(ctx, cmd)
	if err != nil {
		return "", err
	}
	return cmd.Text()
}

func TestAloneIsSentAlone(t *testing.T) {
	f, client := newFake(t)
	c := New(client, 0)
	if len(c.lanes) != DefaultLanes {
		t.Fatalf("%d lanes, want DefaultLanes (%d)", len(c.lanes), DefaultLanes)
	}
	for i := range 100 {
		got, err := echo(t.Context(), c, strconv.Itoa(i))
		if err != nil || got != strconv.Itoa(i) {
			t.Fatalf("call %d: %q, %v", i, got, err)
		}
	}
	if alone, pipes := f.counts(); alone != 100 || len(pipes) != 0 {
		t.Fatalf("sent %d alone and %v pipelines, want 100 alone and none", alone, pipes)
	}
}

// start runs echo(s) on c in a goroutine and returns its reply's channel.
func start(ctx context.Context, c *Coalescer, s string) <-chan error {
	errs := make(chan error, 1)
	go func() {
		got, err := echo(ctx, c, s)
		if err == nil && got != s {
			err = fmt.Errorf("echo %q replied %q", s, got)
		}
		errs <- err
	}()
	return errs
}

// holdFirst makes f hold the commands sent alone, starts one on c, and
// returns once it is held, with the func that lets it go.
func holdFirst(t *testing.T, f *fake, c *Coalescer) (first <-chan error, release func()) {
	t.Helper()
	hold, held := make(chan struct{}), make(chan struct{}, 16)
	f.mu.Lock()
	f.hold, f.held = hold, held
	f.mu.Unlock()
	first = start(t.Context(), c, "first")
	<-held
	var once sync.Once
	release = func() {
		once.Do(func() {
			f.mu.Lock()
			f.hold = nil
			f.mu.Unlock()
			close(hold)
		})
	}
	t.Cleanup(release)
	return first, release
}

func TestQueuedGoInOnePipeline(t *testing.T) {
	f, client := newFake(t)
	c := New(client, 1)
	first, release := holdFirst(t, f, c)
	var errs []<-chan error
	for i := range 10 {
		errs = append(errs, start(t.Context(), c, strconv.Itoa(i)))
	}
	waitQueued(t, c, 10)
	release()
	for i, e := range append(errs, first) {
		if err := <-e; err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if alone, pipes := f.counts(); alone != 1 || len(pipes) != 1 || pipes[0] != 10 {
		t.Fatalf("sent %d alone and pipelines %v, want the first alone and one pipeline of 10", alone, pipes)
	}
	if got, err := echo(t.Context(), c, "after"); err != nil || got != "after" {
		t.Fatalf("a call after the pipeline: %q, %v", got, err)
	}
}

func TestRawCommandsQueue(t *testing.T) {
	f, client := newFake(t)
	c := New(client, 1)
	_, release := holdFirst(t, f, c)
	cmds := make([]*redis.RawCmd, 3)
	var wg sync.WaitGroup
	for i := range cmds {
		cmds[i] = redis.NewRawCmd(t.Context(), "echo", "v"+strconv.Itoa(i))
		wg.Go(func() { _ = c.ProcessUncopied(t.Context(), cmds[i]) })
	}
	waitQueued(t, c, 3)
	release()
	wg.Wait()
	for i, cmd := range cmds {
		want := fmt.Sprintf("$2\r\nv%d\r\n", i)
		if got, err := cmd.Result(); err != nil || string(got) != want {
			t.Fatalf("raw command %d: %q, %v; want %q", i, got, err, want)
		}
	}
}

func TestCallerThatLeavesIsNotSent(t *testing.T) {
	f, client := newFake(t)
	c := New(client, 1)
	first, release := holdFirst(t, f, c)
	ctx, cancel := context.WithCancel(t.Context())
	leaving := start(ctx, c, "leaving")
	staying := start(t.Context(), c, "staying")
	waitQueued(t, c, 2)
	cancel()
	if err := <-leaving; !errors.Is(err, context.Canceled) {
		t.Fatalf("the caller that left got %v, want context.Canceled at once", err)
	}
	release()
	for _, e := range []<-chan error{first, staying} {
		if err := <-e; err != nil {
			t.Fatal(err)
		}
	}
	// The one command left is sent alone, not in a pipeline.
	if alone, pipes := f.counts(); alone != 2 || len(pipes) != 0 {
		t.Fatalf("sent %d alone and pipelines %v, want 2 alone and no pipeline", alone, pipes)
	}
}

// A caller that leaves while its command is in a pipeline returns at once;
// its own command, not a copy, is what the pipeline sends and answers
// later, and the caller does not read it (-race checks that nothing else
// does).
func TestCallerThatLeavesAPipelineIsWrittenLater(t *testing.T) {
	f, client := newFake(t)
	c := New(client, 1)
	holdPipe, heldPipe := make(chan struct{}), make(chan struct{}, 1)
	f.mu.Lock()
	f.holdPipes, f.heldPipe = holdPipe, heldPipe
	f.mu.Unlock()
	first, release := holdFirst(t, f, c)
	ctx, cancel := context.WithCancel(t.Context())
	left := redis.NewCmd(ctx, "echo", "left")
	leaving := make(chan error, 1)
	go func() { leaving <- c.ProcessUncopied(ctx, left) }()
	staying := start(t.Context(), c, "staying")
	waitQueued(t, c, 2)
	release()
	<-heldPipe
	cancel()
	if err := <-leaving; !errors.Is(err, context.Canceled) {
		t.Fatalf("the caller that left got %v, want context.Canceled at once", err)
	}
	close(holdPipe)
	for _, e := range []<-chan error{first, staying} {
		if err := <-e; err != nil {
			t.Fatal(err)
		}
	}
	// staying's reply came after the whole pipeline's: left is written.
	if got, err := left.Text(); err != nil || got != "left" {
		t.Fatalf("the left command holds %q, %v; want the pipeline's reply \"left\"", got, err)
	}
	if alone, pipes := f.counts(); alone != 1 || len(pipes) != 1 || pipes[0] != 2 {
		t.Fatalf("sent %d alone and pipelines %v, want the first alone and one pipeline of 2", alone, pipes)
	}
}

func TestDeadlineEndsAQueuedCall(t *testing.T) {
	f, client := newFake(t)
	c := New(client, 1)
	_, _ = holdFirst(t, f, c)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	begin := time.Now()
	_, err := echo(ctx, c, "late")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want context.DeadlineExceeded", err)
	}
	if took := time.Since(begin); took > 5*time.Second {
		t.Fatalf("a queued call with a 20ms deadline returned after %v", took)
	}
}

func TestHeldLaneLeavesTheOthers(t *testing.T) {
	f, client := newFake(t)
	c := New(client, 2)
	_, release := holdFirst(t, f, c) // lane A held
	f.mu.Lock()
	f.hold = nil // the other lane answers
	f.mu.Unlock()
	for i := range 20 {
		if got, err := echo(t.Context(), c, strconv.Itoa(i)); err != nil || got != strconv.Itoa(i) {
			t.Fatalf("call %d beside a held lane: %q, %v", i, got, err)
		}
	}
	if queued(c) != 0 {
		t.Fatalf("%d calls queued behind the held lane while another was idle", queued(c))
	}
	release()
}

func TestFailedPipelineFailsItsCalls(t *testing.T) {
	f, client := newFake(t)
	c := New(client, 1)
	boom := errors.New("connection reset")
	f.mu.Lock()
	f.failPipes = boom
	f.mu.Unlock()
	first, release := holdFirst(t, f, c)
	var errs []<-chan error
	for i := range 4 {
		errs = append(errs, start(t.Context(), c, strconv.Itoa(i)))
	}
	waitQueued(t, c, 4)
	release()
	if err := <-first; err != nil {
		t.Fatalf("the command sent alone: %v", err)
	}
	for i, e := range errs {
		if err := <-e; !errors.Is(err, boom) {
			t.Fatalf("queued call %d: %v, want the pipeline's error", i, err)
		}
	}
	if got, err := echo(t.Context(), c, "after"); err != nil || got != "after" {
		t.Fatalf("a call after the failed pipeline: %q, %v", got, err)
	}
}

func TestPipelineRunsUnderTheLatestDeadline(t *testing.T) {
	f, client := newFake(t)
	c := New(client, 1)
	_, release := holdFirst(t, f, c)
	near, cancelNear := context.WithTimeout(t.Context(), time.Hour)
	defer cancelNear()
	far, cancelFar := context.WithTimeout(t.Context(), 2*time.Hour)
	defer cancelFar()
	a, b := start(near, c, "a"), start(far, c, "b")
	waitQueued(t, c, 2)
	release()
	<-a
	<-b
	farEnd, _ := far.Deadline()
	f.mu.Lock()
	got := f.pipeDeadline
	f.mu.Unlock()
	if !got.Equal(farEnd) {
		t.Fatalf("the pipeline ran until %v, want the latest deadline %v", got, farEnd)
	}
}

// counter counts the INCRs sent alone and the pipelines of a real client.
type counter struct{ alone, pipelines, piped atomic.Int64 }

func (*counter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "incr" {
			h.alone.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (h *counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.pipelines.Add(1)
		h.piped.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// manyCallers runs 64 callers × 100 INCRs of their own key through a
// Coalescer over client, and checks every reply.
func manyCallers(t *testing.T, client Client, prefix string) {
	t.Helper()
	c := New(client, 2)
	const callers, calls = 64, 100
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for g := range callers {
		wg.Go(func() {
			key := fmt.Sprintf("%s{k%d}", prefix, g)
			for i := range calls {
				ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
				cmd := redis.NewCmd(ctx, "incr", key)
				err := c.ProcessUncopied(ctx, cmd)
				cancel()
				n, _ := cmd.Int64()
				if err != nil || n != int64(i+1) {
					errs <- fmt.Errorf("caller %d, INCR %d: %d, %v", g, i+1, n, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func TestManyCallersOnRedis(t *testing.T) {
	redistest.NeedRedisServer(t)
	client := redistest.Server(t)
	before, err := redistest.CommandStat(t.Context(), client, "incr", "calls")
	if err != nil {
		t.Fatal(err)
	}
	h := &counter{}
	client.AddHook(h)
	manyCallers(t, client, redistest.Prefix(t))
	after, err := redistest.CommandStat(t.Context(), client, "incr", "calls")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("6400 INCRs: %d sent alone, %d in %d pipelines", h.alone.Load(), h.piped.Load(), h.pipelines.Load())
	if after-before != 6400 {
		t.Fatalf("Redis ran %d INCRs, want 6400", after-before)
	}
	if h.pipelines.Load() == 0 {
		t.Fatal("64 callers on 2 lanes never shared a pipeline")
	}
}

func TestManyCallersOnACluster(t *testing.T) {
	redistest.NeedRedisServer(t)
	client := redistest.Cluster(t)
	manyCallers(t, client, redistest.Prefix(t))
}

func TestFirstKey(t *testing.T) {
	key := "k"
	for _, tc := range []struct {
		args []any
		want string
		ok   bool
	}{
		{[]any{"get", "k"}, "k", true},
		{[]any{"set", &key, "v", "nx"}, "k", true},
		{[]any{"evalsha", "sha", 1, &key, "a"}, "k", true},
		{[]any{"eval", "return 1", 1, "k"}, "k", true},
		{[]any{"evalsha", "sha", 0}, "", false},
		{[]any{"ping"}, "", false},
		{[]any{"get", 7}, "", false},
	} {
		got, ok := firstKey(redis.NewCmd(t.Context(), tc.args...))
		if got != tc.want || ok != tc.ok {
			t.Errorf("firstKey(%v) = %q, %v; want %q, %v", tc.args, got, ok, tc.want, tc.ok)
		}
	}
}

// On a cluster whose master hangs, the calls of the other masters' keys go
// on: each master has lanes of its own.
func TestClusterLanesPerMaster(t *testing.T) {
	redistest.NeedRedisServer(t)
	client := redistest.Cluster(t)
	c := NewCluster(client, 1)
	prefix := redistest.Prefix(t)
	// Two keys on different masters.
	a, b := prefix+"{a}", ""
	ma, err := client.MasterForKey(t.Context(), a)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; b == ""; i++ {
		k := fmt.Sprintf("%s{b%d}", prefix, i)
		m, err := client.MasterForKey(t.Context(), k)
		if err != nil {
			t.Fatal(err)
		}
		if m.Options().Addr != ma.Options().Addr {
			b = k
		}
	}
	// A BLPOP on a's master holds its one lane (until the LPUSH below);
	// b's master has a lane of its own.
	blocked := make(chan error, 1)
	go func() {
		blocked <- c.ProcessUncopied(t.Context(), redis.NewStringSliceCmd(t.Context(), "blpop", a, 30))
	}()
	for queued := 0; queued == 0; {
		time.Sleep(time.Millisecond)
		co, ok := c.nodes.Load(ma.Options().Addr)
		if ok {
			l := &co.(*Coalescer).lanes[0]
			l.mu.Lock()
			if l.busy {
				queued = 1
			}
			l.mu.Unlock()
		}
	}
	for i := range 10 {
		cmd := redis.NewCmd(t.Context(), "incr", b)
		if err := c.ProcessUncopied(t.Context(), cmd); err != nil {
			t.Fatalf("INCR %d on the other master: %v", i, err)
		}
	}
	select {
	case err := <-blocked:
		t.Fatalf("BLPOP returned %v before the other master's calls were done", err)
	default:
	}
	if err := client.LPush(t.Context(), a, "x").Err(); err != nil {
		t.Fatal(err)
	}
	if err := <-blocked; err != nil {
		t.Fatalf("BLPOP: %v", err)
	}
}
