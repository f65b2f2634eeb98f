package redisrepo

// HashSlot exports hashSlot to the tests.
var HashSlot = hashSlot

// FormatVersion exports formatVersion to the tests.
const FormatVersion = formatVersion
