// Package redisreply tells the error replies with which Redis refuses a
// client (its credentials, a permission, its database) from its other
// replies and from failures. The fx module's start-up check, the Redis
// store and the observability package classify with it, so that one
// refusal is one thing to all three.
package redisreply

import (
	"errors"
	"strings"
)

// The refusals Refusal tells apart. Each is how the client is set up, not
// an outage: waiting does not mend it.
const (
	// Credentials is WRONGPASS or NOAUTH: a wrong or missing user name or
	// password.
	Credentials = "credentials"
	// Permission is NOPERM: an ACL user that may not run a command or touch
	// a key.
	Permission = "permission"
	// Database is an unknown database ("ERR DB index is out of range", or
	// "ERR invalid DB index" from older servers).
	Database = "database"
)

// Refusal returns Credentials, Permission or Database when err is, or
// wraps, an error reply of Redis that refuses the client, and "" for any
// other error (another reply, a timeout, an unreachable server) or nil.
// Only a reply counts: an error that merely says the same words does not.
func Refusal(err error) string {
	var reply interface { // go-redis's error replies
		error
		RedisError()
	}
	if !errors.As(err, &reply) {
		return ""
	}
	switch msg := reply.Error(); {
	case strings.HasPrefix(msg, "WRONGPASS"), strings.HasPrefix(msg, "NOAUTH"):
		return Credentials
	case strings.HasPrefix(msg, "NOPERM"):
		return Permission
	case strings.HasPrefix(msg, "ERR DB index is out of range"), strings.HasPrefix(msg, "ERR invalid DB index"):
		return Database
	}
	return ""
}
