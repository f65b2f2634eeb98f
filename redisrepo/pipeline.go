package redisrepo

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// This file is the bulk calls' pipelines: sending them in bounded parts,
// reloading a script that the server's cache lost, and giving each command
// its error when the pipeline never ran.

// pipeline sends cmds in one pipeline: one round trip per node. The
// commands that meet a server without their script (NOSCRIPT: a restart, a
// failover, SCRIPT FLUSH) are sent again in a second one, after the script
// is loaded on every master (as LoadScripts does); one that meets NOSCRIPT
// again keeps the error.
func (s *Store) pipeline(ctx context.Context, p pipeliner, cmds []*redis.Cmd) {
	send(ctx, p, cmds)
	var again []*redis.Cmd
	loaded := make(map[any]error)
	for j, cmd := range cmds {
		if !isNoScript(cmd.Err()) {
			continue
		}
		args := cmd.Args()
		if len(args) < 2 || args[0] != argEvalSha {
			continue
		}
		sha := args[1]
		err, done := loaded[sha]
		if !done {
			err = s.loadScript(ctx, sha)
			loaded[sha] = err
		}
		if err == nil {
			cmds[j] = redis.NewCmd(ctx, args...)
			again = append(again, cmds[j])
		}
	}
	send(ctx, p, again)
}

// maxPipeline bounds the commands of one pipeline of a bulk call: a call
// with more sends them in pipelines of maxPipeline, one after the other, so
// that neither the client's write buffer nor Redis's reply buffer for the
// connection holds more than maxPipeline replies at once (a 100-byte
// result is about 150 KB of replies), and other clients' commands are
// not held up behind one giant pipeline.
const maxPipeline = 1000

// send sends cmds, if any, in pipelines of p of at most maxPipeline
// commands, one after the other; each command carries its own reply or
// error.
func send(ctx context.Context, p pipeliner, cmds []*redis.Cmd) {
	for len(cmds) > 0 {
		n := min(len(cmds), maxPipeline)
		pipe := p.Pipeline()
		for _, cmd := range cmds[:n] {
			_ = pipe.Process(ctx, cmd)
		}
		execPipeline(ctx, pipe)
		cmds = cmds[n:]
	}
}

// execPipeline runs pipe, after which each of its commands carries its own
// reply or error, which go-redis leaves undone in one case: when Redis
// refused the pipeline's connection as it was set up (WRONGPASS, NOAUTH, an
// unknown database), go-redis returns that reply as the pipeline's error
// and gives it to no command, which would then read as an empty reply (a
// nil script reply, an absent key). execPipeline gives it to each of them.
func execPipeline(ctx context.Context, pipe redis.Pipeliner) {
	unsent(pipe.Exec(ctx))
}

// unsent gives err, the error of a pipeline of cmds, to each of them when
// none has an error of its own: the pipeline never ran (see execPipeline).
// A pipeline that ran returns the first error of its commands.
func unsent(cmds []redis.Cmder, err error) {
	if err == nil {
		return
	}
	for _, c := range cmds {
		if c.Err() != nil {
			return
		}
	}
	for _, c := range cmds {
		c.SetErr(err)
	}
}

// loadScript loads the script of this package whose SHA-1 is sha into the
// script cache of the client's servers (of every master, on a
// *redis.ClusterClient).
func (s *Store) loadScript(ctx context.Context, sha any) error {
	for _, h := range hotScripts {
		if h.sha == sha {
			return s.client.ScriptLoad(ctx, h.body.(string)).Err()
		}
	}
	for _, sc := range scripts {
		if sha == any(sc.Hash()) {
			return sc.Load(ctx, s.client).Err()
		}
	}
	return fmt.Errorf("redisrepo: no script has the SHA-1 %v", sha)
}
