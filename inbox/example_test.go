package inbox_test

import (
	"context"
	"database/sql"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/inbox"
)

// A consumer service during the migration: it reads the legacy RabbitMQ
// queue and the JetStream durable consumer at the same time, and one Inbox
// makes it act once per message id whichever broker delivers it first.
// (Compiled, not run: it needs the services and runs until a signal.)
func Example_dualRead() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))

	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	// Create or upgrade the inbox table (safe from every instance at once).
	db := stdlib.OpenDBFromPool(pool)
	if err := inbox.Migrate(ctx, db, "inbox"); err != nil {
		log.Fatal(err)
	}
	db.Close()

	in, err := inbox.New(pool, inbox.Config{
		Table:      "inbox",
		Consumer:   "billing", // one name per consumer group, shared by its instances
		Logger:     logger,
		Registerer: prometheus.DefaultRegisterer,
	})
	if err != nil {
		log.Fatal(err)
	}
	go in.RunCleanup(ctx, time.Minute)
	// Messages already received are finished after a signal, not cut short.
	work := context.WithoutCancel(ctx)

	// The task: its writes go through tx, so they commit together with the
	// record of the message id, or not at all.
	handle := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO invoices (order_message_id, body) VALUES ($1, $2)`, m.ID, m.Payload)
		return err
	}

	// Legacy: RabbitMQ queue, manual acks, bounded prefetch.
	conn, err := amqp.Dial(os.Getenv("AMQP_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		log.Fatal(err)
	}
	if err := ch.Qos(100, 0, false); err != nil {
		log.Fatal(err)
	}
	deliveries, err := ch.Consume("billing.orders", "billing", false, false, false, false, nil)
	if err != nil {
		log.Fatal(err)
	}
	amqpDone := make(chan struct{})
	go func() {
		defer close(amqpDone)
		for d := range deliveries {
			// Acks, requeues or rejects d itself.
			if err := in.HandleAMQP(work, d, handle); err != nil {
				logger.Warn("amqp message not processed", "error", err)
			}
		}
	}()

	// New: JetStream durable pull consumer, explicit acks.
	nc, err := nats.Connect(os.Getenv("NATS_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	// relayd's defaults: the stream OUTBOX (RELAY_NATS_STREAM), each subject
	// "outbox." (RELAY_NATS_SUBJECT_PREFIX) + topic; here the topics orders.*.
	cons, err := js.CreateOrUpdateConsumer(ctx, "OUTBOX", jetstream.ConsumerConfig{
		Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: "outbox.orders.>",
	})
	if err != nil {
		log.Fatal(err)
	}
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		// Acks, naks with backoff or terminates msg itself.
		if err := in.HandleJetStream(work, msg, handle); err != nil {
			logger.Warn("nats message not processed", "error", err)
		}
	})
	if err != nil {
		log.Fatal(err)
	}

	// Soft stop: stop receiving from both brokers, let the messages already
	// received finish (and be acked), then close.
	<-ctx.Done()
	cc.Stop()
	<-cc.Closed()
	if err := ch.Cancel("billing", false); err != nil {
		logger.Warn("cancel amqp consumer", "error", err)
	}
	<-amqpDone // deliveries is closed once the buffered ones were handled
	ch.Close()
}

// A service that runs its own migration step can run the inbox's goose
// provider in it, and check it at start.
func ExampleNewProvider() {
	ctx := context.Background()
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	p, err := inbox.NewProvider(db, "billing.inbox", nil) // versions in billing.inbox_schema_version
	if err != nil {
		log.Fatal(err)
	}
	if _, err := p.Up(ctx); err != nil {
		log.Fatal(err)
	}
}
