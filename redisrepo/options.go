package redisrepo

// DefaultKeyPrefix is the prefix of every Redis key the Store writes unless
// WithKeyPrefix says otherwise.
const DefaultKeyPrefix = "idempotency:"

// An Option configures a Store; pass them to New.
type Option interface{ apply(*Store) }

type optionFunc func(*Store)

func (f optionFunc) apply(s *Store) { f(s) }

// WithKeyPrefix sets the prefix of the Redis keys: a record lives under
// prefix + operation + ":" + key. Default DefaultKeyPrefix ("idempotency:").
// An empty prefix is allowed. A prefix with a Redis Cluster hash tag, such as
// "{idempotency}:", puts every record in one hash slot, and so on one node;
// see the package documentation.
func WithKeyPrefix(prefix string) Option {
	return optionFunc(func(s *Store) { s.prefix = prefix })
}
