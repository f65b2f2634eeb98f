package redisrepo

import "strings"

// slotCount is the number of hash slots of a Redis Cluster.
const slotCount = 16384

// hashSlot returns the Redis Cluster hash slot of a Redis key, as the
// server computes it (CLUSTER KEYSLOT): CRC16 (XMODEM) of the key modulo
// 16384, where a key with a hash tag — a non-empty part between the first
// "{" and the first "}" after it — hashes only that part.
func hashSlot(key string) int {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if n := strings.IndexByte(key[open+1:], '}'); n > 0 {
			key = key[open+1 : open+1+n]
		}
	}
	return int(crc16(key) % slotCount)
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial value 0), the checksum
// Redis Cluster hashes keys with.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^s[i]]
	}
	return crc
}

// crc16Table holds the CRC of every byte value, for crc16.
var crc16Table = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()
