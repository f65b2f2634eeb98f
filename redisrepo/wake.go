package redisrepo

import (
	"context"
	"sync"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/redis/go-redis/v9"
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

// shardSubscriber is the part of a go-redis cluster client that subscribes
// to sharded channels (Redis 7.0 or newer).
type shardSubscriber interface {
	SSubscribe(ctx context.Context, channels ...string) *redis.PubSub
}

var _ idemstore.Watcher = (*Store)(nil)

// Watch implements idemstore.Watcher: it reads the record under key as Get
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
// Redis Cluster (a *redis.ClusterClient) the channel is sharded (SPUBLISH,
// SSUBSCRIBE, Redis 7.0 or newer), one per hash slot with waiters, named
// with a hash tag of the key's slot: an announcement stays on the key's own
// node, nothing is broadcast to the others, and a frozen node delays only
// the waits on its own keys. A process then holds one subscription per slot
// it waits on.
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
func (s *Store) Watch(ctx context.Context, key idemstore.Key) (idemstore.Record, <-chan struct{}, func(), error) {
	rkey := s.Key(key)
	ch, stop := s.waiters.add(rkey)
	rec, err := s.get(ctx, idemevent.MethodGet, rkey, true)
	if err != nil || rec.State != idemstore.StatePending {
		stop()
		return rec, nil, func() {}, err
	}
	return rec, ch, stop, nil
}

// waiters is the Store's subscriptions, one per wake-up channel that a
// caller waits on (one in all, except on Redis Cluster: one per slot), and
// the channels of the callers that wait, by Redis key.
type waiters struct {
	s     *Store
	mu    sync.Mutex
	keys  map[string]map[chan struct{}]struct{}
	subs  map[string]*subscription // by wake-up channel
	sleep time.Duration            // the pause after a broken subscription
}

// linger is how long a subscription outlives the last waiter, so that a
// process whose waits follow one another closely (a burst of retries on
// many keys) keeps one connection instead of opening one per wait. Short,
// so that nothing of the Store outlives its use for long.
const linger = 100 * time.Millisecond

func newWaiters(s *Store) *waiters {
	return &waiters{s: s, keys: map[string]map[chan struct{}]struct{}{}, subs: map[string]*subscription{}, sleep: 100 * time.Millisecond}
}

// subscription is one Pub/Sub subscription to a wake-up channel.
type subscription struct {
	n    int           // callers waiting on it
	idle *time.Timer   // ends it, linger after the last waiter left; nil while anyone waits
	quit chan struct{} // closed to end the subscription
	done chan struct{} // closed when it has ended
}

// add registers a waiter on rkey and returns its channel, and the func that
// removes it. It does not wait for the subscription: see Watch. A client
// that cannot subscribe is polled.
func (w *waiters) add(rkey string) (chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	channel := w.s.wakeChannel(rkey)
	w.mu.Lock()
	set := w.keys[rkey]
	if set == nil {
		set = map[chan struct{}]struct{}{}
		w.keys[rkey] = set
	}
	set[ch] = struct{}{}
	sub := w.subs[channel]
	if sub == nil {
		if open := w.opener(channel); open != nil {
			sub = &subscription{quit: make(chan struct{}), done: make(chan struct{})}
			w.subs[channel] = sub
			go w.run(channel, open, sub)
		}
	}
	if sub != nil {
		sub.n++
		if sub.idle != nil {
			sub.idle.Stop() // if it fired already, closeIdle sees n > 0 and keeps sub
			sub.idle = nil
		}
	}
	w.mu.Unlock()
	var once sync.Once
	return ch, func() { once.Do(func() { w.remove(rkey, channel, ch) }) }
}

// opener returns the func that subscribes to channel: SSUBSCRIBE on Redis
// Cluster, SUBSCRIBE elsewhere; nil when the client cannot subscribe.
func (w *waiters) opener(channel string) func(ctx context.Context) *redis.PubSub {
	if w.s.sharded {
		if cl, ok := w.s.client.(shardSubscriber); ok {
			return func(ctx context.Context) *redis.PubSub { return cl.SSubscribe(ctx, channel) }
		}
		return nil
	}
	if cl, ok := w.s.client.(subscriber); ok {
		return func(ctx context.Context) *redis.PubSub { return cl.Subscribe(ctx, channel) }
	}
	return nil
}

// remove drops a waiter; its subscription ends linger after the last one.
func (w *waiters) remove(rkey, channel string, ch chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	set := w.keys[rkey]
	delete(set, ch)
	if len(set) == 0 {
		delete(w.keys, rkey)
	}
	sub := w.subs[channel]
	if sub == nil {
		return
	}
	sub.n--
	if sub.n == 0 {
		sub.idle = time.AfterFunc(linger, func() { w.closeIdle(channel, sub) })
	}
}

// closeIdle ends sub, the subscription to channel, if nobody has waited on
// it since the timer was armed, and waits for it to end.
func (w *waiters) closeIdle(channel string, sub *subscription) {
	w.mu.Lock()
	if sub.n > 0 || w.subs[channel] != sub {
		w.mu.Unlock()
		return
	}
	delete(w.subs, channel)
	sub.idle = nil
	w.mu.Unlock()
	close(sub.quit)
	<-sub.done
}

// run subscribes, then delivers each announced key to its waiters until quit.
// When the subscription breaks, every waiter is woken (a message may have
// been lost: they read again), and go-redis subscribes again at the next
// receive. When the node drops a sharded subscription because the slot
// moved (a resharding), run subscribes again, after w.sleep, on the slot's
// new owner; the waiters poll meanwhile.
//
// Every step runs on a context that quit cancels, so that a connection that
// hangs (a dial, a node that does not answer) ends with the subscription.
// Each confirmation of the subscription, the first and those after a break,
// wakes every waiter: an announcement sent before it was not heard.
func (w *waiters) run(channel string, open func(context.Context) *redis.PubSub, sub *subscription) {
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
	subscribe := func() {
		p := open(ctx) // dials: may hang until quit
		mu.Lock()
		ps = p
		if quit {
			_ = ps.Close()
		}
		mu.Unlock()
	}
	subscribe()
	for {
		msg, err := ps.Receive(ctx)
		moved := resharding(err)
		switch m := msg.(type) {
		case *redis.Message:
			w.wake(m.Payload)
			continue
		case *redis.Subscription:
			if m.Kind != "sunsubscribe" {
				w.wakeAll(channel)
				continue
			}
			// We never unsubscribe: the node did, as Redis does to the
			// subscribers of a slot's sharded channels when the slot
			// moves to another node (a resharding). go-redis keeps the
			// connection to that node, deaf: subscribe again, where the
			// slot lives now.
			moved = true
		case *redis.Pong:
			continue
		}
		if err == nil && !moved {
			continue
		}
		if moved {
			// The slot lives elsewhere now (the node's sunsubscribe, or
			// its MOVED answer to a subscription sent on a stale slot
			// map): let the client reload its map while we pause, then
			// subscribe anew, on the slot's owner.
			if r, ok := w.s.client.(reloader); ok {
				r.ReloadState(ctx)
			}
			mu.Lock()
			_ = ps.Close()
			mu.Unlock()
		}
		t := time.NewTimer(w.sleep)
		select {
		case <-sub.quit:
			t.Stop()
			return
		default:
		}
		w.wakeAll(channel)
		select {
		case <-sub.quit:
			t.Stop()
			return
		case <-t.C:
		}
		if moved {
			subscribe()
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

// wakeAll wakes every waiter on a key announced on channel.
func (w *waiters) wakeAll(channel string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for rkey, set := range w.keys {
		if w.s.wakeChannel(rkey) != channel {
			continue
		}
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
