package redisreply_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/idemkit/idempotency/internal/redisreply"
)

// reply is an error reply as go-redis returns one (proto.RedisError).
type reply string

func (r reply) Error() string { return string(r) }
func (reply) RedisError()     {}

func TestRefusal(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{reply("WRONGPASS invalid username-password pair or user is disabled."), redisreply.Credentials},
		{reply("NOAUTH Authentication required."), redisreply.Credentials},
		{reply("NOPERM this user has no permissions to run the 'evalsha' command"), redisreply.Permission},
		{reply("NOPERM this user has no permissions to access one of the keys used as arguments"), redisreply.Permission},
		{reply("ERR DB index is out of range"), redisreply.Database},
		{reply("ERR invalid DB index"), redisreply.Database},
		{fmt.Errorf("idempotency: storage reserve: %w", reply("NOPERM no permissions")), redisreply.Permission},
		// Other replies, failures, and texts that are not replies.
		{reply("WRONGTYPE Operation against a key holding the wrong kind of value"), ""},
		{reply("OOM command not allowed when used memory > 'maxmemory'."), ""},
		{reply("READONLY You can't write against a read only replica."), ""},
		{errors.New("NOPERM this user has no permissions to run the 'set' command"), ""},
		{errors.New("dial tcp 127.0.0.1:6379: connect: connection refused"), ""},
		{nil, ""},
	} {
		if got := redisreply.Refusal(tc.err); got != tc.want {
			t.Errorf("Refusal(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}
