package redisrepo

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"
)

// fenceKeepLeases is how many leases a key's fence key outlives the
// reservation that last set it. While it lives, every fence is one more
// than the last at least; after it, fences come from the server's clock
// alone (see ReserveFenced).
const fenceKeepLeases = 10

// fenceKey returns the name of the key that keeps the last fence of the
// record under key: prefix + operation + "#fence{TAG}:" + key, where TAG
// puts it in the record's hash slot, so that one script can write both on
// Redis Cluster. No record's name looks like it: an operation has no "#".
func (s *Store) fenceKey(key idemstore.Key, rkey string) string {
	return s.prefix + key.Operation + "#fence{" + slotTags()[hashSlot(rkey)] + "}:" + key.Key
}

// ReserveFenced implements idemstore.Fencer: it is Reserve for a
// reservation (w.State must be pending), in one round trip (a script), and
// the record it writes gets a fence. The fence is one more than the key's
// last, which its fence key keeps for ten leases after the reservation, or
// the Redis server's clock in microseconds if that is more; so fences grow
// across release, expiry, takeover and Forget (which leaves fence keys
// alone), and after the fence key expired, as long as the server's clock
// does not step back by more than ten leases. What Redis loses (a restart
// without persistence, a failover to a replica that had not yet received the
// fence key) it cannot keep: see docs/architecture.md, "Fences". It returns
// a *coordinator.StorageError when Redis fails, w is not pending, or the
// Store writes record format 1 (WithRecordFormat(Format1)), which has no
// fences.
func (s *Store) ReserveFenced(ctx context.Context, key idemstore.Key, w idemstore.Write) (idemstore.Record, uint64, bool, error) {
	if w.State != idemstore.StatePending {
		return idemstore.Record{}, 0, false, storageError(idemevent.MethodReserve,
			fmt.Errorf("redisrepo: a fenced write is a reservation, got state %s", w.State))
	}
	if s.format == Format1 {
		return idemstore.Record{}, 0, false, storageError(idemevent.MethodReserve, errFencesNeedFormat2)
	}
	ttl, err := millis(w.TTL)
	if err != nil {
		return idemstore.Record{}, 0, false, storageError(idemevent.MethodReserve, err)
	}
	val, err := encodeRecord(w.State, w.Token, w.Fingerprint, nil)
	if err != nil {
		return idemstore.Record{}, 0, false, storageError(idemevent.MethodReserve, err)
	}
	rkey := s.Key(key)
	fkey := s.fenceKey(key, rkey)
	if s.sharded && hashSlot(fkey) != hashSlot(rkey) {
		return idemstore.Record{}, 0, false, storageError(idemevent.MethodReserve,
			fmt.Errorf("redisrepo: key prefix %q has a \"{\" without a \"}\": a fence cannot share its record's hash slot on Redis Cluster", s.prefix))
	}
	replace := argNoReplace
	if w.Replace {
		replace = argReplace
	}
	v, err := fenceScript.Run(ctx, s.client, []string{rkey, fkey},
		val, ttl, replace, storedToken(w.ReplaceToken), w.ReplaceToken, storedToken(w.Token),
		ttl*fenceKeepLeases).Result()
	if err != nil {
		return idemstore.Record{}, 0, false, storageError(idemevent.MethodReserve, err)
	}
	return fenceReply(v)
}

// errFencesNeedFormat2 is the error of ReserveFenced on a Store that writes
// record format 1.
var errFencesNeedFormat2 = errors.New("redisrepo: fences need record format 2, and this Store writes format 1 (WithRecordFormat)")

// fenceReply reads the reply of fence.lua.
func fenceReply(v any) (idemstore.Record, uint64, bool, error) {
	if n, ok := v.(int64); ok && n > 0 {
		return idemstore.Record{}, uint64(n), true, nil
	}
	if own, ok := v.([]any); ok && len(own) == 2 {
		str, ok1 := own[0].(string)
		n, ok2 := own[1].(int64)
		if ok1 && ok2 && n >= 0 {
			return decodeValue([]byte(str)), uint64(n), false, nil
		}
	}
	rec, err := decodeReply(v)
	if err != nil {
		return idemstore.Record{}, 0, false, storageError(idemevent.MethodReserve, err)
	}
	return rec, 0, false, nil
}
