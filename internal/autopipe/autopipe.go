// Package autopipe sends a Redis store's commands through go-redis's
// AutoPipeliner, which batches the commands of concurrent callers into
// pipelines (idempotency.NewStoreClient, IDEMPOTENCY_REDIS_AUTO_PIPELINE).
package autopipe

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/redisrepo"
)

// Wrap returns a redisrepo.Client that sends the store's scripts through ap
// and everything else (Pub/Sub, pipelines) to client, whose AutoPipeliner ap
// is; over a *redis.ClusterClient it also has ReloadState.
func Wrap(ap *redis.AutoPipeliner, client redis.UniversalClient) redisrepo.Client {
	pc := &pipelinedClient{ap: ap, client: client}
	if cc, ok := client.(*redis.ClusterClient); ok {
		return &pipelinedClusterClient{pipelinedClient: pc, cluster: cc}
	}
	return pc
}

// pipelinedClusterClient is a pipelinedClient over a *redis.ClusterClient.
// Its ReloadState tells the store that it talks to a cluster, so that the
// store rides through a resharding (a removed node's refused dials, and a
// circuit breaker opened by them, among them) as it does over the cluster
// client itself: without it, every call that the stale slot map sent to a
// removed node was a storage error (docs/reliability.md, finding 8).
type pipelinedClusterClient struct {
	*pipelinedClient
	cluster *redis.ClusterClient
}

// ReloadState asks the cluster client to reload its slot map.
func (p *pipelinedClusterClient) ReloadState(ctx context.Context) { p.cluster.ReloadState(ctx) }

// pipelinedClient is the store's client with IDEMPOTENCY_REDIS_AUTO_PIPELINE
// on: scripts and commands go through ap, client's deferred AutoPipeliner,
// and every call returns when the caller's context is done.
//
// An AutoPipeliner runs a queued command on a context of its own, not the
// caller's: against a frozen redis-server, a GET with a 100ms deadline
// returned after 35s (go-redis v9.23, its default 5s read timeout, with
// retries). So each call submits its command (AutoPipeliner.Submit, which
// does not block) and waits for it only until its context is done
// (AutoFuture.WaitContext): no goroutine and no timer of its own. A command
// left behind runs on in its batch; what it writes is never read.
//
// A call that no caller waits for (coordinator.OffRequestPath: a save round
// in the background, a renewal) goes to client directly: it may take what is
// left of the reservation, on its own context, and the circuit breaker lets
// it through only there (a batch runs on the pipeliner's context).
//
// Besides redisrepo.Client it has the optional methods the store looks for,
// Subscribe and Pipeline, which go to client: a subscription needs a
// connection of its own, and a pipeline is already one round trip, bounded by
// the context (ContextTimeoutEnabled).
type pipelinedClient struct {
	ap     *redis.AutoPipeliner  // client's deferred (async) face
	client redis.UniversalClient // ap's client
}

var _ redisrepo.Client = (*pipelinedClient)(nil)

// Process sends cmd through the AutoPipeliner when it is a *redis.Cmd or a
// *redis.RawCmd (what the store sends), else to the client, unbatched. A
// copy of cmd is what goes through the pipeliner, so that cmd is not written
// once Process has returned; its reply is copied into cmd.
func (p *pipelinedClient) Process(ctx context.Context, cmd redis.Cmder) error {
	if coordinator.OffRequestPath(ctx) {
		return p.client.Process(ctx, cmd)
	}
	switch c := cmd.(type) {
	case *redis.Cmd:
		return processCopy(ctx, p, c)
	case *redis.RawCmd:
		return processCopy(ctx, p, c)
	}
	return p.client.Process(ctx, cmd)
}

// ProcessUncopied sends cmd as Process does, but not a copy of it: when it
// returns ctx's error, cmd runs on in its batch and may be written later,
// and its caller must not read it. The store sends its own commands so
// (redisrepo's send), which spares the copy's two allocations per call.
func (p *pipelinedClient) ProcessUncopied(ctx context.Context, cmd redis.Cmder) error {
	if coordinator.OffRequestPath(ctx) {
		return p.client.Process(ctx, cmd)
	}
	switch cmd.(type) {
	case *redis.Cmd, *redis.RawCmd:
		_, err := p.submit(ctx, cmd)
		return err
	}
	return p.client.Process(ctx, cmd)
}

// valueCmd is a command whose reply can be copied into another of its type.
type valueCmd[V any] interface {
	redis.Cmder
	Val() V
	SetVal(V)
}

// processCopy sends a copy of cmd through p's AutoPipeliner and copies its
// reply into cmd, or ctx's error when ctx is done first.
func processCopy[V any, C valueCmd[V]](ctx context.Context, p *pipelinedClient, cmd C) error {
	sent := cmd.Clone().(C)
	if left, err := p.submit(ctx, sent); left {
		cmd.SetErr(err)
		return err
	}
	cmd.SetVal(sent.Val())
	cmd.SetErr(sent.Err())
	return sent.Err()
}

// Eval implements redis.Scripter, through the AutoPipeliner.
func (p *pipelinedClient) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	if coordinator.OffRequestPath(ctx) {
		return p.client.Eval(ctx, script, keys, args...)
	}
	return p.script(ctx, "eval", script, keys, args)
}

// EvalSha implements redis.Scripter, through the AutoPipeliner.
func (p *pipelinedClient) EvalSha(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	if coordinator.OffRequestPath(ctx) {
		return p.client.EvalSha(ctx, sha1, keys, args...)
	}
	return p.script(ctx, "evalsha", sha1, keys, args)
}

// EvalRO implements redis.Scripter, through the AutoPipeliner.
func (p *pipelinedClient) EvalRO(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	if coordinator.OffRequestPath(ctx) {
		return p.client.EvalRO(ctx, script, keys, args...)
	}
	return p.script(ctx, "eval_ro", script, keys, args)
}

// EvalShaRO implements redis.Scripter, through the AutoPipeliner.
func (p *pipelinedClient) EvalShaRO(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	if coordinator.OffRequestPath(ctx) {
		return p.client.EvalShaRO(ctx, sha1, keys, args...)
	}
	return p.script(ctx, "evalsha_ro", sha1, keys, args)
}

// script runs name (EVAL, EVALSHA or their _RO forms) of script through the
// AutoPipeliner, the command laid out as go-redis's Eval lays it out.
func (p *pipelinedClient) script(ctx context.Context, name, script string, keys []string, args []any) *redis.Cmd {
	cmdArgs := make([]any, 0, 3+len(keys)+len(args))
	cmdArgs = append(cmdArgs, name, script, len(keys))
	for _, k := range keys {
		cmdArgs = append(cmdArgs, k)
	}
	cmdArgs = append(cmdArgs, args...)
	cmd := redis.NewCmd(ctx, cmdArgs...)
	if len(keys) > 0 {
		cmd.SetFirstKeyPos(3)
	}
	if left, err := p.submit(ctx, cmd); left {
		return failedCmd(ctx, err)
	}
	return cmd
}

// ScriptExists implements redis.Scripter on the client (on a cluster, every
// master answers), as the AutoPipeliner does.
func (p *pipelinedClient) ScriptExists(ctx context.Context, hashes ...string) *redis.BoolSliceCmd {
	return p.client.ScriptExists(ctx, hashes...)
}

// ScriptLoad implements redis.Scripter on the client (on a cluster, every
// master loads it), as the AutoPipeliner does.
func (p *pipelinedClient) ScriptLoad(ctx context.Context, script string) *redis.StringCmd {
	return p.client.ScriptLoad(ctx, script)
}

// Subscribe opens a subscription on the client.
func (p *pipelinedClient) Subscribe(ctx context.Context, channels ...string) *redis.PubSub {
	return p.client.Subscribe(ctx, channels...)
}

// Pipeline returns a pipeline of the client.
func (p *pipelinedClient) Pipeline() redis.Pipeliner { return p.client.Pipeline() }

// submit queues cmd in the AutoPipeliner and waits until it has run, or
// until ctx is done. left reports the latter, with ctx's error: cmd runs on
// in its batch, and the caller must not read it.
func (p *pipelinedClient) submit(ctx context.Context, cmd redis.Cmder) (left bool, err error) {
	if err := ctx.Err(); err != nil {
		return true, err
	}
	err = p.ap.Submit(ctx, cmd).WaitContext(ctx)
	if cerr := ctx.Err(); err != nil && cerr != nil && errors.Is(err, cerr) {
		return true, err
	}
	return false, err
}

// failedCmd returns a command that failed with err.
func failedCmd(ctx context.Context, err error) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(err)
	return cmd
}
