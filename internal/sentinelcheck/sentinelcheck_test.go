package sentinelcheck_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/internal/sentinelcheck"
)

func TestMain(m *testing.M) {
	redis.SetLogger(&lines) // go-redis tells of each master it switches to
	// go-redis's pool probes a server it failed to dial from a goroutine
	// that notices its pool closed within a second (the sentinel that is
	// down, in TestMasterAsksTheSentinelThatAnswered).
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}

// lines is what go-redis logged.
var lines logLines

type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) Printf(_ context.Context, format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(format, v...))
}

// waitSwitchSeen waits until the client has switched to the master at addr
// (go-redis logs it as it does).
func waitSwitchSeen(t *testing.T, addr string) {
	t.Helper()
	want := fmt.Sprintf("new master=%q addr=%q", "m", addr)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		lines.mu.Lock()
		seen := slices.ContainsFunc(lines.lines, func(l string) bool { return strings.Contains(l, want) })
		lines.mu.Unlock()
		if seen {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the client did not switch to %s", addr)
		}
	}
}

// TestNoConnectionToAReplacedMaster is finding 4's race, made to happen: a
// dial of the failover client asks the sentinel for the master (A), the
// sentinel fails A over to B and announces it, the client switches to B,
// and only then does the dial get its answer, A. go-redis alone switches
// back to A and keeps a connection to it, so the call lands on the former
// master; with the check the connection is refused and the call lands on
// B, as every later one does.
func TestNoConnectionToAReplacedMaster(t *testing.T) {
	redistest.NeedRedisServer(t)
	for _, tc := range []struct {
		name   string
		client func(*redis.FailoverOptions) *redis.Client
		former bool // the call lands on the former master
	}{
		{"go-redis alone", redis.NewFailoverClient, true},
		{"checked", sentinelcheck.New, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			onFormer, during := raceTheSwitch(t, tc.client, 1) // the dial's own question
			if during != nil {
				t.Fatal(during)
			}
			switch {
			case tc.former && onFormer == 0:
				t.Fatalf("go-redis alone no longer keeps a connection to the replaced master: the check may go")
			case !tc.former && onFormer > 0:
				t.Fatalf("%d of 2 calls made after the switch landed on the former master", onFormer)
			}
			t.Logf("%d of 2 calls made after the switch landed on the former master", onFormer)
		})
	}
}

// TestNoWriteAfterTheSwitch is the window that a check at dial time left
// open (it failed the upgrade storm of make test-valkey once): the check
// asked the sentinel before the failover and got its answer, A, after the
// announcement, and the connection joined the pool after go-redis had
// closed A's others on the announcement, so calls kept using it. The check
// now runs at the connection's first write, once it is in the pool: the
// announcement closes it with the others, and neither the call in flight
// nor any later one reaches A.
func TestNoWriteAfterTheSwitch(t *testing.T) {
	redistest.NeedRedisServer(t)
	// go-redis's dial asks the sentinel (answered); the new connection's
	// check asks again (held across the failover).
	onFormer, during := raceTheSwitch(t, sentinelcheck.New, 2)
	if onFormer > 0 {
		t.Fatalf("%d of 2 calls made after the switch landed on the former master (the call in flight returned %v)", onFormer, during)
	}
	t.Logf("the call in flight at the switch returned %v; the next one landed on the new master", during)
}

// raceTheSwitch makes a call meet a failover from A to B as it connects:
// the sentinel holds its n-th next answer for the master (1: the dial's
// own question, 2: the check's) across the failover and its announcement.
// It returns how many of that call and the next one wrote to A, and the
// call's error.
func raceTheSwitch(t *testing.T, newClient func(*redis.FailoverOptions) *redis.Client, n int) (onFormer int64, during error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, b := startServer(t), startServer(t)
	s := startSentinel(t, a.Addr())
	c := newClient(&redis.FailoverOptions{
		MasterName:            "m",
		SentinelAddrs:         []string{s.addr()},
		DialerRetries:         1,
		ContextTimeoutEnabled: true,
	})
	defer c.Close()
	if err := c.Set(ctx, "before", 1, 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.waitSubscribed(t)
	// The client's connections to A go, so that the next call dials.
	admin := redis.NewClient(&redis.Options{Addr: a.Addr()})
	defer admin.Close()
	if err := admin.Do(ctx, "client", "kill", "type", "normal").Err(); err != nil {
		t.Fatal(err)
	}
	held := s.holdAnswer(n)
	done := make(chan error, 1)
	go func() { done <- c.Set(ctx, "during", 1, 0).Err() }()
	select {
	case <-held:
	case <-ctx.Done():
		t.Fatalf("the call did not ask the sentinel for the master %d times", n)
	}
	s.switchTo(t, b.Addr())
	waitSwitchSeen(t, b.Addr())
	s.release()
	during = <-done
	if err := c.Set(ctx, "after", 1, 0).Err(); err != nil {
		t.Fatal(err)
	}
	return admin.Exists(ctx, "during", "after").Val(), during
}

// TestCheckBoundedByTheCallsDeadline: a sentinel that does not answer the
// check holds a new connection's first write only until the call's
// deadline, and a call after the sentinel answers again goes through.
func TestCheckBoundedByTheCallsDeadline(t *testing.T) {
	redistest.NeedRedisServer(t)
	a := startServer(t)
	s := startSentinel(t, a.Addr())
	c := sentinelcheck.New(&redis.FailoverOptions{
		MasterName:            "m",
		SentinelAddrs:         []string{s.addr()},
		DialerRetries:         1,
		MaxRetries:            -1,
		ContextTimeoutEnabled: true,
	})
	defer c.Close()
	held := s.holdAnswer(2) // go-redis's own question is answered; the check's is not
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := c.Set(ctx, "k", 1, 0).Err()
	took := time.Since(start)
	select {
	case <-held:
	default:
		t.Fatal("the new connection did not ask the sentinel for the master")
	}
	if err == nil {
		t.Fatal("a call whose connection could not be checked in time succeeded")
	}
	if took > 2*time.Second {
		t.Fatalf("the call returned after %v, far beyond its 300ms deadline", took)
	}
	t.Logf("the call returned after %v: %v", took.Round(time.Millisecond), err)
	s.release()
	if err := c.Set(t.Context(), "k", 1, 0).Err(); err != nil {
		t.Fatalf("once the sentinel answers: %v", err)
	}
}

func startServer(t *testing.T) *redistest.Process {
	t.Helper()
	p, err := redistest.StartProcess(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	return p
}

// fakeSentinel answers as a sentinel does the commands a failover client
// sends (RESP2: HELLO is refused): the master's address, no other
// sentinels, and subscriptions, on which switchTo announces a failover.
// holdAnswer holds one answer for the master's address, which keeps the
// address it had when it was asked, until release.
type fakeSentinel struct {
	ln net.Listener
	wg sync.WaitGroup

	mu     sync.Mutex
	master string
	subs   []*fakeConn
	conns  []net.Conn
	skip   int           // answers to send before the held one
	hold   chan struct{} // closed once the held request arrived
	freed  chan struct{} // closed by release
}

type fakeConn struct {
	mu sync.Mutex
	c  net.Conn
}

func (f *fakeConn) write(s string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, _ = io.WriteString(f.c, s)
}

func startSentinel(t *testing.T, master string) *fakeSentinel {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &fakeSentinel{ln: ln, master: master}
	s.wg.Add(1)
	go s.accept()
	t.Cleanup(s.close)
	return s
}

func (s *fakeSentinel) addr() string { return s.ln.Addr().String() }

func (s *fakeSentinel) close() {
	_ = s.ln.Close()
	s.mu.Lock()
	for _, c := range s.conns {
		_ = c.Close()
	}
	if s.freed != nil {
		select {
		case <-s.freed:
		default:
			close(s.freed)
		}
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func (s *fakeSentinel) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns = append(s.conns, c)
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serve(&fakeConn{c: c})
	}
}

func (s *fakeSentinel) serve(c *fakeConn) {
	defer s.wg.Done()
	r := bufio.NewReader(c.c)
	subscribed := false
	for {
		args, err := readCommand(r)
		if err != nil {
			return
		}
		switch cmd := strings.ToLower(args[0]); {
		case cmd == "hello":
			c.write("-ERR unknown command 'HELLO'\r\n")
		case cmd == "client":
			c.write("+OK\r\n")
		case cmd == "ping" && subscribed:
			c.write("*2\r\n$4\r\npong\r\n$0\r\n\r\n")
		case cmd == "ping":
			c.write("+PONG\r\n")
		case cmd == "subscribe":
			s.mu.Lock()
			s.subs = append(s.subs, c)
			s.mu.Unlock()
			subscribed = true
			for i, ch := range args[1:] {
				c.write(fmt.Sprintf("*3\r\n$9\r\nsubscribe\r\n%s:%d\r\n", bulk(ch), i+1))
			}
		case cmd == "sentinel" && len(args) == 3 && strings.EqualFold(args[1], "get-master-addr-by-name"):
			s.mu.Lock()
			addr, hold, freed := s.master, s.hold, s.freed
			if s.skip > 0 {
				s.skip--
				hold = nil
			} else {
				s.hold = nil
			}
			s.mu.Unlock()
			if hold != nil {
				close(hold)
				<-freed
			}
			host, port, _ := net.SplitHostPort(addr)
			c.write("*2\r\n" + bulk(host) + bulk(port))
		case cmd == "sentinel" && len(args) == 3 && strings.EqualFold(args[1], "sentinels"):
			c.write("*0\r\n")
		default:
			c.write("-ERR unknown command\r\n")
		}
	}
}

func bulk(s string) string { return "$" + strconv.Itoa(len(s)) + "\r\n" + s + "\r\n" }

// readCommand reads one command, an array of bulk strings.
func readCommand(r *bufio.Reader) ([]string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "*")))
	if err != nil || n < 1 {
		return nil, fmt.Errorf("not a command: %q", line)
	}
	args := make([]string, n)
	for i := range args {
		line, err := r.ReadString('\n')
		if err != nil {
			return nil, err
		}
		size, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "$")))
		if err != nil {
			return nil, fmt.Errorf("not a bulk string: %q", line)
		}
		buf := make([]byte, size+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		args[i] = string(buf[:size])
	}
	return args, nil
}

// holdAnswer holds the n-th next answer for the master's address (1 is
// the next); the channel returned is closed once that request arrived.
func (s *fakeSentinel) holdAnswer(n int) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.skip = n - 1
	s.hold, s.freed = make(chan struct{}), make(chan struct{})
	return s.hold
}

// release sends the held answer.
func (s *fakeSentinel) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.freed)
}

// switchTo makes addr the master and announces it (+switch-master).
func (s *fakeSentinel) switchTo(t *testing.T, addr string) {
	t.Helper()
	s.mu.Lock()
	from := s.master
	s.master = addr
	subs := s.subs
	s.mu.Unlock()
	fh, fp, _ := net.SplitHostPort(from)
	th, tp, _ := net.SplitHostPort(addr)
	msg := strings.Join([]string{"m", fh, fp, th, tp}, " ")
	for _, c := range subs {
		c.write("*3\r\n" + bulk("message") + bulk("+switch-master") + bulk(msg))
	}
}

// waitSubscribed waits until a client listens for failovers.
func (s *fakeSentinel) waitSubscribed(t *testing.T) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		s.mu.Lock()
		n := len(s.subs)
		s.mu.Unlock()
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the client never subscribed to the sentinel's announcements")
		}
	}
}
