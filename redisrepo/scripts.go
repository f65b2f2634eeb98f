package redisrepo

import (
	_ "embed"

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

// The compiled scripts: immutable package values, run with EVALSHA and
// falling back to EVAL when the server does not have them cached.
var (
	reserveScript  = redis.NewScript(recordLua + reserveLua)
	getScript      = redis.NewScript(recordLua + getLua)
	completeScript = redis.NewScript(recordLua + completeLua)
	releaseScript  = redis.NewScript(recordLua + releaseLua)
	renewScript    = redis.NewScript(recordLua + renewLua)
	inspectScript  = redis.NewScript(recordLua + inspectLua)
	forgetScript   = redis.NewScript(recordLua + forgetLua)
)

// scripts lists every script, for LoadScripts.
var scripts = [...]*redis.Script{
	reserveScript, getScript, completeScript, releaseScript, renewScript,
	inspectScript, forgetScript,
}
