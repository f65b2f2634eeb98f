package redisrepo

import (
	_ "embed"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// The Lua sources. record.lua is the shared prelude: it reads the record
// format, so every script sees a record the same way.
var (
	//go:embed record.lua
	recordLua string
	//go:embed reserve.lua
	reserveLua string
	//go:embed get.lua
	getLua string
	//go:embed complete.lua
	completeLua string
	//go:embed release.lua
	releaseLua string
	//go:embed renew.lua
	renewLua string
	//go:embed inspect.lua
	inspectLua string
	//go:embed forget.lua
	forgetLua string
)

// prelude starts every script: the constants that Go and Lua share, written
// from their Go values so that each is defined once (the format version, and
// the state codes that decodeState reads back), then record.lua.
var prelude = fmt.Sprintf("local VERSION = %q\nlocal ABSENT, PENDING, COMPLETED, UNREADABLE = %d, %d, %d, %d\n",
	formatVersion, codeAbsent, codePending, codeCompleted, codeUnreadable) + recordLua

// The compiled scripts: immutable package values, run with EVALSHA and
// falling back to EVAL when the server does not have them cached.
var (
	reserveScript  = redis.NewScript(prelude + reserveLua)
	getScript      = redis.NewScript(prelude + getLua)
	completeScript = redis.NewScript(prelude + completeLua)
	releaseScript  = redis.NewScript(prelude + releaseLua)
	renewScript    = redis.NewScript(prelude + renewLua)
	inspectScript  = redis.NewScript(prelude + inspectLua)
	forgetScript   = redis.NewScript(prelude + forgetLua)
)

// scripts lists every script, for LoadScripts.
var scripts = [...]*redis.Script{
	reserveScript, getScript, completeScript, releaseScript, renewScript,
	inspectScript, forgetScript,
}
