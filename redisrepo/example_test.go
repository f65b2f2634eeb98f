package redisrepo_test

import (
	"context"
	"fmt"
	"log"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/redisrepo"
)

// A Store takes any go-redis client: standalone, Sentinel or Cluster.
func ExampleNew() {
	client := redis.NewUniversalClient(&redis.UniversalOptions{
		Addrs: []string{"localhost:6379"},
	})
	defer client.Close()

	store := redisrepo.New(client, redisrepo.WithKeyPrefix("billing:idempotency:"))
	if err := store.LoadScripts(context.Background()); err != nil {
		log.Printf("redis is not reachable yet: %v", err) // the scripts load on first use anyway
	}
	fmt.Println(store.Key(idemstore.Key{Operation: "payment.charge", Key: "order-42"}))
}

// An operator looks at keys and forgets one so that its client may retry.
func ExampleStore_Inspect() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer client.Close()
	store := redisrepo.New(client)

	keys := []idemstore.Key{
		{Operation: "payment.charge", Key: "order-42"},
		{Operation: "payment.charge", Key: "order-43"},
	}
	infos, err := store.Inspect(ctx, keys...)
	if err != nil {
		log.Fatal(err)
	}
	for _, in := range infos {
		fmt.Printf("%s: %s, expires in %v\n", in.RedisKey, in.State, in.TTL)
	}
	if n, err := store.Forget(ctx, keys[0]); err == nil {
		fmt.Printf("forgot %d key(s)\n", n)
	}
}

// During a rolling upgrade from a release before record format 2, the new
// release writes format 1, which the old one reads; both read both. Deploy
// again with the default (Format2) once the old release is gone.
func ExampleWithRecordFormat() {
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer client.Close()

	store := redisrepo.New(client, redisrepo.WithRecordFormat(redisrepo.Format1))
	c, err := coordinator.New(store)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	fmt.Println("writing record format", redisrepo.Format1)
	// Output: writing record format 1
}

// A caller that waits on a key held in another process is woken when the
// holder completes it, through the store's Watch: the coordinator does this
// by itself. Watching a record nobody holds returns it and no channel.
func ExampleStore_Watch() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer client.Close()
	store := redisrepo.New(client)

	rec, changed, stop, err := store.Watch(ctx, idemstore.Key{Operation: "payment.charge", Key: "order-42"})
	if err != nil {
		log.Printf("redis: %v", err)
		return
	}
	defer stop()
	if rec.State == idemstore.StatePending {
		select {
		case <-changed: // completed or released: read it again
		case <-ctx.Done():
		}
	}
}
