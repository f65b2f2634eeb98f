package redisrepo

import (
	"strconv"
	"sync"
)

// slotTags returns, for each hash slot of a Redis Cluster, a short string
// that hashes to it: a channel named "...{tag}" lives in that slot, so a
// sharded wake-up channel can be put in the slot of any key, whatever
// braces the key holds. Computed once, on first use, and never changed.
var slotTags = sync.OnceValue(func() *[slotCount]string {
	var tags [slotCount]string
	left := slotCount
	for i := 0; left > 0; i++ {
		tag := strconv.FormatInt(int64(i), 36)
		if slot := crc16(tag) % slotCount; tags[slot] == "" {
			tags[slot] = tag
			left--
		}
	}
	return &tags
})

// wakeChannel returns the channel on which the completion or release of the
// record under rkey is announced: the Store's one channel, or on Redis
// Cluster a sharded channel in rkey's own hash slot (SPUBLISH, SSUBSCRIBE),
// so that the announcement stays on the key's node.
func (s *Store) wakeChannel(rkey string) string {
	if !s.sharded {
		return s.channel
	}
	return string(s.appendShardChannel(nil, rkey))
}

// appendShardChannel appends the sharded wake-up channel of rkey's slot.
func (s *Store) appendShardChannel(dst []byte, rkey string) []byte {
	dst = append(dst, s.channel...)
	dst = append(dst, '{')
	dst = append(dst, slotTags()[hashSlot(rkey)]...)
	return append(dst, '}')
}

// publishArg is the command of the scripts that announce: PUBLISH, or
// SPUBLISH for a sharded channel.
func (s *Store) publishArg() any {
	if s.sharded {
		return argSPublish
	}
	return argPublish
}

var argPublish, argSPublish any = "PUBLISH", "SPUBLISH"
