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
	//go:embed confirm.lua
	confirmLua string
	//go:embed unwrite.lua
	unwriteLua string

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
	unwriteScript  = redis.NewScript(prelude + unwriteLua)

	// The writer of format 1 (WithRecordFormat(Format1)).
	reserve1Script = redis.NewScript(prelude + reserve1Lua)
	owner1Script   = redis.NewScript(prelude + owner1Lua)
)

// confirmSrc is the text of confirm.lua, the check of an acknowledged
// completion sent again (WithReplicaAcks): a rare path, sent whole with
// EVAL in the pipeline of its WAIT.
var confirmSrc = minify(constants + confirmLua)

// scripts lists the EVALSHA scripts, for LoadScripts.
var scripts = [...]*redis.Script{legacyScript, reserveScript, fenceScript, abandon1Script, inspectScript, forgetScript, unwriteScript, reserve1Script, owner1Script}

// The scripts of the common paths: a first run's completion, a long
// action's renewals, a release, a waiter's read, a collision's check for a
// wedged record. Each runs with EVALSHA, and is sent whole with EVAL only
// after Redis answers NOSCRIPT (see hotScript): a call never fails for an
// empty script cache after a restart, a failover or SCRIPT FLUSH, and costs
// one more round trip once per script and server when it meets one.
var (
	completeScript = newHotScript(constants + ownerLua + completeLua)
	renewScript    = newHotScript(constants + ownerLua + renewLua)
	releaseScript  = newHotScript(constants + ownerLua + releaseLua)
	watchScript    = newHotScript(constants + watchLua)
	abandonScript  = newHotScript(constants + ownerLua + abandonLua)

	hotScripts = [...]*hotScript{&completeScript, &renewScript, &releaseScript, &watchScript, &abandonScript}
)

// evalArgs returns args, the arguments of an EVALSHA of a hot script, as
// those of an EVAL of its text: for a server that answered NOSCRIPT. It
// returns args as they are when they are not those of a hot script.
func evalArgs(args []any) []any {
	if len(args) < 2 || args[0] != argEvalSha {
		return args
	}
	for _, h := range hotScripts {
		if args[1] == h.sha {
			e := append([]any{argEval, h.body}, args[2:]...)
			return e
		}
	}
	return args
}

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
