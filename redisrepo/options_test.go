package redisrepo_test

import (
	"errors"
	"testing"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/redisrepo"
)

// An invalid option makes New panic with an error that names the option and
// the value; a nil option is skipped (docs/user-guide.md, "Options").
func TestNewFollowsTheOptionRule(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	t.Cleanup(func() { _ = client.Close() })

	s := redisrepo.New(client, nil, redisrepo.WithKeyPrefix("p:"), nil)
	if got := s.Key(idemstore.Key{Operation: "op", Key: "k"}); got != "p:op:k" {
		t.Fatalf("Key = %q, want p:op:k: the options around the nil ones were lost", got)
	}

	// Building the option does not panic; New does.
	bad := redisrepo.WithRecordFormat(3)
	defer func() {
		err, _ := recover().(error)
		var oe *coordinator.OptionError
		if !errors.As(err, &oe) || oe.Option != "WithRecordFormat" {
			t.Fatalf("recovered %v; want an error with a *coordinator.OptionError for WithRecordFormat", err)
		}
		if want := "redisrepo: invalid options: WithRecordFormat: must be Format1 (1) or Format2 (2), got 3"; err.Error() != want {
			t.Fatalf("panic %q, want %q", err, want)
		}
	}()
	redisrepo.New(client, bad)
	t.Fatal("New did not panic")
}
