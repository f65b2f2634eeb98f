package redisrepo

// HashSlot exports hashSlot to the tests.
var HashSlot = hashSlot

// FormatVersion exports formatVersion to the tests.
const FormatVersion = formatVersion

// The scripts, for the benchmarks' raw go-redis baselines.
var (
	ReserveScript = reserveScript
	GetScript     = getScript
)
