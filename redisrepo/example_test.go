package redisrepo_test

import (
	"context"
	"fmt"
	"log"

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
	fmt.Println(store.Key(coordinator.Key{Operation: "payment.charge", Key: "order-42"}))
}

// An operator looks at keys and forgets one so that its client may retry.
func ExampleStore_Inspect() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer client.Close()
	store := redisrepo.New(client)

	keys := []coordinator.Key{
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
