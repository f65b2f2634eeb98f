package redisrepo

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
)

// wakeChannelPrefix starts the name of the Pub/Sub channel on which the
// completion or release of a record that a caller waits on is announced:
// wakeChannelPrefix + the Store's key prefix. The message is the record's
// Redis key.
const wakeChannelPrefix = "idemkit:wake:"

// subscriber is the part of a go-redis client that subscribes to Pub/Sub
// channels. Every go-redis client has it; a Client without it is polled.
type subscriber interface {
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
}

var _ coordinator.Watcher = (*Store)(nil)

// Watch implements coordinator.Watcher: it reads the record under key as Get
// does and, when it is a pending record, marks it as waited on and returns a
// channel that receives a value when the record's completion or release is
// announced, from any process. stop ends the watch; call it once.
//
// The announcements travel on one Pub/Sub subscription per Store, opened by
// the first watch and closed 100ms after the last one stops: a process
// subscribes once, however many callers wait, and waits that follow one
// another closely share it. A completion or release publishes only
// when the record was marked, so one that nobody waits on sends nothing. A
// message can be lost (a subscription that broke, a cluster node that
// failed): the coordinator keeps polling, backed off, beside the channel. On
// Redis Cluster the channel is an ordinary one, which the cluster bus
// carries to every node: only contended keys publish, so the traffic is that
// of the waits, not of the calls.
//
// The read never waits for the subscription: a watch registers its channel
// and reads at once, on the whole of ctx. A subscription that is not
// confirmed yet (a new connection that hangs, a node that does not answer)
// costs the read nothing; when it is confirmed later, every waiter's
// channel receives a value, since an announcement sent before then was not
// heard.
//
// It returns a *coordinator.StorageError when the read fails. A subscription
// that fails is not an error: the caller polls.
func (s *Store) Watch(ctx context.Context, key coordinator.Key) (coordinator.Record, <-chan struct{}, func(), error) {
	rkey := s.Key(key)
	ch, stop := s.waiters.add(rkey)
	rec, err := s.get(ctx, coordinator.MethodGet, rkey, true)
	if err != nil || rec.State != coordinator.StatePending {
		stop()
		return rec, nil, func() {}, err
	}
	return rec, ch, stop, nil
}

// waiters is the Store's one subscription and the channels of the callers
// that wait, by Redis key.
type waiters struct {
	s     *Store
	mu    sync.Mutex
	keys  map[string]map[chan struct{}]struct{}
	n     int           // callers waiting
	sub   *subscription // nil when nobody waits (after linger) or the client cannot subscribe
	idle  *time.Timer   // ends sub, linger after the last waiter left; nil while anyone waits
	sleep time.Duration // the pause after a broken subscription
}

// linger is how long the subscription outlives the last waiter, so that a
// process whose waits follow one another closely (a burst of retries on
// many keys) keeps one connection instead of opening one per wait. Short,
// so that nothing of the Store outlives its use for long.
const linger = 100 * time.Millisecond

func newWaiters(s *Store) *waiters {
	return &waiters{s: s, keys: map[string]map[chan struct{}]struct{}{}, sleep: 100 * time.Millisecond}
}

// subscription is one Pub/Sub subscription to the wake-up channel.
type subscription struct {
	quit chan struct{} // closed to end the subscription
	done chan struct{} // closed when it has ended
}

// add registers a waiter on rkey and returns its channel, and the func that
// removes it. It does not wait for the subscription: see Watch.
func (w *waiters) add(rkey string) (chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	w.mu.Lock()
	set := w.keys[rkey]
	if set == nil {
		set = map[chan struct{}]struct{}{}
		w.keys[rkey] = set
	}
	set[ch] = struct{}{}
	w.n++
	if w.idle != nil {
		w.idle.Stop() // if it fired already, closeIdle sees n > 0 and keeps sub
		w.idle = nil
	}
	if w.sub == nil {
		if cl, ok := w.s.client.(subscriber); ok {
			sub := &subscription{quit: make(chan struct{}), done: make(chan struct{})}
			w.sub = sub
			go w.run(cl, sub)
		}
	}
	w.mu.Unlock()
	var once sync.Once
	return ch, func() { once.Do(func() { w.remove(rkey, ch) }) }
}

// remove drops a waiter; the subscription ends linger after the last one.
func (w *waiters) remove(rkey string, ch chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	set := w.keys[rkey]
	delete(set, ch)
	if len(set) == 0 {
		delete(w.keys, rkey)
	}
	w.n--
	if w.n == 0 && w.sub != nil {
		w.idle = time.AfterFunc(linger, w.closeIdle)
	}
}

// closeIdle ends the subscription if nobody has waited since the timer was
// armed, and waits for it to end.
func (w *waiters) closeIdle() {
	w.mu.Lock()
	if w.n > 0 || w.sub == nil {
		w.mu.Unlock()
		return
	}
	sub := w.sub
	w.sub, w.idle = nil, nil
	w.mu.Unlock()
	close(sub.quit)
	<-sub.done
}

// run subscribes, then delivers each announced key to its waiters until quit.
// When the subscription breaks, every waiter is woken (a message may have
// been lost: they read again), and go-redis subscribes again at the next
// receive.
//
// Every step runs on a context that quit cancels, so that a connection that
// hangs (a dial, a node that does not answer) ends with the subscription.
// Each confirmation of the subscription, the first and those after a break,
// wakes every waiter: an announcement sent before it was not heard.
func (w *waiters) run(cl subscriber, sub *subscription) {
	defer close(sub.done)
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var ps *redis.PubSub
	quit := false
	var closer sync.WaitGroup
	closer.Add(1)
	go func() { // a receive ends when the connection is closed, not by a context
		defer closer.Done()
		<-sub.quit
		cancel() // ends a dial that hangs, in Subscribe or a receive
		mu.Lock()
		defer mu.Unlock()
		quit = true
		if ps != nil {
			_ = ps.Close()
		}
	}()
	defer closer.Wait()
	p := cl.Subscribe(ctx, w.s.channel) // dials: may hang until quit
	mu.Lock()
	ps = p
	if quit {
		_ = ps.Close()
	}
	mu.Unlock()
	for {
		msg, err := ps.Receive(ctx)
		switch m := msg.(type) {
		case *redis.Message:
			w.wake(m.Payload)
			continue
		case *redis.Subscription:
			w.wakeAll()
			continue
		case *redis.Pong:
			continue
		}
		if err == nil {
			continue
		}
		t := time.NewTimer(w.sleep)
		select {
		case <-sub.quit:
			t.Stop()
			return
		default:
		}
		w.wakeAll()
		select {
		case <-sub.quit:
			t.Stop()
			return
		case <-t.C:
		}
	}
}

func (w *waiters) wake(rkey string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for ch := range w.keys[rkey] {
		notify(ch)
	}
}

func (w *waiters) wakeAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, set := range w.keys {
		for ch := range set {
			notify(ch)
		}
	}
}

func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
