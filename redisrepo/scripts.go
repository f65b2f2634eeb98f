package redisrepo

import (
	_ "embed"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// The Lua sources. record.lua is the prelude of the scripts that read
// records of either format; owner.lua is the small prelude of the scripts
// sent whole on every call.
var (
	//go:embed record.lua
	recordLua string
	//go:embed legacy.lua
	legacyLua string
	//go:embed reserve.lua
	reserveLua string
	//go:embed fence.lua
	fenceLua string
	//go:embed abandon1.lua
	abandon1Lua string
	//go:embed inspect.lua
	inspectLua string
	//go:embed forget.lua
	forgetLua string
	//go:embed reserve1.lua
	reserve1Lua string
	//go:embed owner1.lua
	owner1Lua string

	//go:embed owner.lua
	ownerLua string
	//go:embed complete.lua
	completeLua string
	//go:embed release.lua
	releaseLua string
	//go:embed renew.lua
	renewLua string
	//go:embed watch.lua
	watchLua string
	//go:embed abandon.lua
	abandonLua string
)

// constants are the values that Go and Lua share, written from their Go
// values so that each is defined once (the format versions, the state codes
// that decodeState reads back, and the flag bits of format 2).
var constants = fmt.Sprintf("local VERSION, VERSION2 = %q, %d\n"+
	"local ABSENT, PENDING, COMPLETED, UNREADABLE, NOT_REPLAYABLE = %d, %d, %d, %d, %d\n"+
	"local FLAG_WAITERS, FLAG_TOKEN_HEX, FLAG_FP_HEX = %d, %d, %d\n",
	legacyVersion, formatVersion, codeAbsent, codePending, codeCompleted, codeUnreadable, codeNotReplayable,
	flagWaiters, flagTokenHex, flagFPHex)

// The scripts of the rare paths (a format 1 record, a heal, a pending
// record met, the operator calls): run with EVALSHA, falling back to EVAL when the server does not
// have them cached. Immutable package values.
var (
	prelude        = constants + recordLua
	legacyScript   = redis.NewScript(prelude + legacyLua)
	reserveScript  = redis.NewScript(prelude + reserveLua)
	fenceScript    = redis.NewScript(prelude + fenceLua)
	abandon1Script = redis.NewScript(prelude + abandon1Lua)
	inspectScript  = redis.NewScript(prelude + inspectLua)
	forgetScript   = redis.NewScript(prelude + forgetLua)

	// The writer of format 1 (WithRecordFormat(Format1)).
	reserve1Script = redis.NewScript(prelude + reserve1Lua)
	owner1Script   = redis.NewScript(prelude + owner1Lua)
)

// scripts lists the EVALSHA scripts, for LoadScripts.
var scripts = [...]*redis.Script{legacyScript, reserveScript, fenceScript, abandon1Script, inspectScript, forgetScript, reserve1Script, owner1Script}

// The scripts of the common paths, sent whole with EVAL: a first run's
// completion, a long action's renewals, a release, a waiter's read, a
// collision's check for a wedged record. Each is
// a few hundred bytes, which costs Redis about as much as EVALSHA (it hashes
// the text to find the compiled script), and a call never meets an empty
// script cache after a restart, a failover or SCRIPT FLUSH: one round trip,
// always. Boxed once, so that passing them costs no allocation.
var (
	completeBody any = minify(constants + ownerLua + completeLua)
	renewBody    any = minify(constants + ownerLua + renewLua)
	releaseBody  any = minify(constants + ownerLua + releaseLua)
	watchBody    any = minify(constants + watchLua)
	abandonBody  any = minify(constants + ownerLua + abandonLua)
)

// minify drops the comment lines, the indentation and the empty lines of a
// script sent whole: Redis hashes the text of every EVAL to find the
// compiled script, about 3 us of its CPU per kilobyte. The scripts have no
// multi-line strings and no comment after code on a line, so lines can be
// judged one by one (TestMinify checks that the scripts still run).
func minify(src string) string {
	var b strings.Builder
	for line := range strings.SplitSeq(src, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "--") {
			continue
		}
		b.WriteString(line)
		b.WriteByte('\n')
	}
	return b.String()
}
