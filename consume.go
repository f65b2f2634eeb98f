package idempotency

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/fx"
	"go.uber.org/zap"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemconsume"
	"github.com/idemkit/idempotency/idemconsume/redisstream"
	"github.com/idemkit/idempotency/observability"
)

// StreamConsumer describes a Redis Streams consumer for ConsumeStream,
// ConsumeStreamWith and NewStreamConsumer.
type StreamConsumer struct {
	// Stream and Group name the stream and its consumer group; required.
	Stream, Group string
	// Operation is the processor's operation (idemconsume.New): one per
	// consumer group; required.
	Operation string
	// Handler processes a message; required, except for ConsumeStreamWith,
	// which builds it.
	Handler idemconsume.Handler
	// Processor and Consumer are the options of idemconsume.New and
	// redisstream.New; none means their documented defaults.
	Processor []idemconsume.Option
	Consumer  []redisstream.Option
}

// ConsumeStream runs the consumer sc describes with the app's lifecycle,
// through Module's coordinator, in one line:
//
//	idempotency.ConsumeStream(idempotency.StreamConsumer{
//		Stream: "orders", Group: "billing", Operation: "billing.credit", Handler: credit,
//	})
//
// On start it creates the group and begins consuming (redisstream's
// Consumer.Start: a group Redis refuses to create fails start-up); on stop,
// before Module closes the coordinator, it reads no more and waits for the
// messages being handled, bounded by the stop timeout (Consumer.Stop). It
// reads the stream with the app's client when it gave one to Module
// (UseRedisClient), else with a client of its own built from
// IDEMPOTENCY_REDIS_URL, closed on stop. Failed stream commands and dead
// letters are logged through Module's logger, and the consumer's metrics
// registered as Module's are (NewStreamConsumer). An invalid sc stops the
// app with New's error.
func ConsumeStream(sc StreamConsumer) fx.Option {
	return fx.Invoke(func(p streamParams) error { return p.run(sc, sc.Handler) })
}

// ConsumeStreamWith is ConsumeStream for a handler built from a value of
// type D in the graph, such as the service whose method it is:
//
//	idempotency.ConsumeStreamWith(sc, func(l *Ledger) idemconsume.Handler { return l.Credit })
func ConsumeStreamWith[D any](sc StreamConsumer, handler func(D) idemconsume.Handler) fx.Option {
	return fx.Invoke(func(p streamParams, d D) error { return p.run(sc, handler(d)) })
}

type streamParams struct {
	fx.In

	Lifecycle   fx.Lifecycle
	Settings    Settings
	Coordinator *coordinator.Coordinator
	Deps        *consumerDeps
}

func (p streamParams) run(sc StreamConsumer, handle idemconsume.Handler) error {
	sc.Handler = handle
	consumer, err := NewStreamConsumer(p.Settings, p.Deps.client, p.Coordinator, p.Deps.logger, p.Deps.registerer, sc)
	if err != nil {
		return err
	}
	p.Lifecycle.Append(fx.StartStopHook(consumer.Start, consumer.Stop))
	return nil
}

// consumerDeps is what Module lends the consumers of ConsumeStream: its
// logger, registerer and a client for the stream. The type is unexported,
// so that no one else depends on it.
type consumerDeps struct {
	client     redis.UniversalClient
	logger     *zap.Logger
	registerer prometheus.Registerer
}

type consumerDepsParams struct {
	fx.In

	Lifecycle  fx.Lifecycle
	Settings   Settings
	Logger     moduleLogger
	Registerer prometheus.Registerer `optional:"true"`
	Client     redis.UniversalClient `name:"idempotency.redis" optional:"true"`
}

// provideConsumerDeps runs only for an app with a ConsumeStream; the client
// it builds is closed on stop, after the consumers have stopped.
func provideConsumerDeps(p consumerDepsParams) (*consumerDeps, error) {
	d := &consumerDeps{client: p.Client, logger: p.Logger.Logger, registerer: p.Registerer}
	if d.client == nil {
		client, err := NewRedisClient(p.Settings)
		if err != nil {
			return nil, err
		}
		p.Lifecycle.Append(fx.StopHook(client.Close))
		d.client = client
	}
	return d, nil
}

// NewStreamConsumer returns the Redis Streams consumer that ConsumeStream
// runs: idemconsume.New(c, sc.Operation, sc.Processor...) and
// redisstream.New over client, with the hooks of an
// observability.ConsumerObserver first (its log lines on logger, a nil
// logger meaning standard error as for NewObserver; with MetricsEnabled its
// metrics on reg, nil meaning prometheus.DefaultRegisterer), then
// sc.Consumer's options. It returns an error naming what is wrong when sc,
// the settings or an option is invalid, or a metric cannot be registered.
func NewStreamConsumer(s Settings, client redisstream.Client, c *coordinator.Coordinator, logger *zap.Logger, reg prometheus.Registerer, sc StreamConsumer) (*redisstream.Consumer, error) {
	if sc.Handler == nil {
		return nil, errors.New("idempotency: stream consumer: handler is nil")
	}
	if logger == nil {
		var err error
		if logger, err = newStderrLogger(); err != nil {
			return nil, err
		}
	}
	p, err := idemconsume.New(c, sc.Operation, sc.Processor...)
	if err != nil {
		return nil, err
	}
	opts := append(s.observerOptions(), observability.WithLogger(logger))
	if s.MetricsEnabled {
		if reg == nil {
			reg = prometheus.DefaultRegisterer
		}
		opts = append(opts, observability.WithRegisterer(reg))
	}
	obs, err := observability.NewConsumerObserver(sc.Operation, redisstream.Commands(), opts...)
	if err != nil {
		return nil, err
	}
	return redisstream.New(client, p, sc.Stream, sc.Group, sc.Handler, append([]redisstream.Option{
		redisstream.WithOnDecision(obs.OnDecision),
		redisstream.WithOnError(obs.OnError),
		redisstream.WithOnClaim(obs.OnClaim),
	}, sc.Consumer...)...)
}
