package benchmarks

import (
	"context"
	"errors"
	"testing"

	"github.com/valkey-io/valkey-go"

	"github.com/idemkit/idempotency/internal/redistest"
)

// implValkey is the impl that sends raw's commands through valkey-go, the
// client of faustbrian/go-idempotency, which pipelines the commands of
// concurrent callers by default: the least that a library on it sends, and
// so a floor under its time (its own flows add Lua scripts and a HASH).
// It runs beside idemkit and raw in the pipe=off benchmarks.
const implValkey = "valkey-go"

// valkeyClient returns a valkey-go client of the benchmarks' server, with
// its defaults (auto-pipelining on), closed when b ends.
func valkeyClient(b *testing.B) valkey.Client {
	b.Helper()
	opts := redistest.ServerOptions(b)
	c, err := valkey.NewClient(valkey.ClientOption{
		InitAddress:  []string{opts.Addr},
		Username:     opts.Username,
		Password:     opts.Password,
		SelectDB:     opts.DB,
		DisableCache: true, // client-side caching is off in every other impl
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	return c
}

// valkeyReplay GETs key and decodes it.
func valkeyReplay(ctx context.Context, c valkey.Client, key string) error {
	return checkEncoded(c.Do(ctx, c.B().Get().Key(key).Build()).AsBytes())
}

// valkeyTake is SET key token NX PX lease; it reports whether it took key.
func valkeyTake(ctx context.Context, c valkey.Client, key string) (bool, error) {
	err := c.Do(ctx, c.B().Set().Key(key).Value(rawToken).Nx().Px(lease).Build()).Error()
	if valkey.IsValkeyNil(err) {
		return false, nil
	}
	return err == nil, err
}

// valkeyRaw is raw's first run through valkey-go (rawFirstRun).
type valkeyRaw struct{ c valkey.Client }

func (v valkeyRaw) take(ctx context.Context, key string) (bool, error) {
	return valkeyTake(ctx, v.c, key)
}

func (v valkeyRaw) store(ctx context.Context, key string, data []byte) error {
	return v.c.Do(ctx, v.c.B().Set().Key(key).Value(valkey.BinaryString(data)).Px(ttl).Build()).Error()
}

// valkeyRefused is a SET NX PX on key, which another caller holds.
func valkeyRefused(ctx context.Context, c valkey.Client, key string) error {
	ok, err := valkeyTake(ctx, c, key)
	if err != nil {
		return err
	}
	if ok {
		return errors.New("valkey-go: took a key that another caller holds")
	}
	return nil
}
