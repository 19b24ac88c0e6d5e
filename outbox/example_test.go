package outbox_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"fmt"
	"log"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver

	"github.com/relayd/relayd/outbox"
	"github.com/relayd/relayd/schema"
)

// Write the message in the transaction that makes the change it announces.
func ExampleWriter_Write() {
	ctx := context.Background()
	url, table, cleanup := exampleTable(ctx)
	defer cleanup()

	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	w, err := outbox.New(outbox.Config{Table: table})
	if err != nil {
		log.Fatal(err)
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx)
	// ... the business writes, in tx ...
	ids, err := w.Write(ctx, tx, outbox.Message{
		Topic:   "orders.created",
		Key:     "order-42",
		Headers: map[string]string{"Content-Type": "application/json"},
		Payload: []byte(`{"order":42}`),
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}

	var topic string
	err = pool.QueryRow(ctx, "SELECT topic FROM "+table+" WHERE message_id = $1", ids[0]).Scan(&topic)
	fmt.Println(topic, err)
	// Output: orders.created <nil>
}

// With database/sql, WriteSQL takes a *sql.Tx.
func ExampleWriter_WriteSQL() {
	ctx := context.Background()
	url, table, cleanup := exampleTable(ctx)
	defer cleanup()

	db, err := sql.Open("pgx", url)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	w, err := outbox.New(outbox.Config{Table: table})
	if err != nil {
		log.Fatal(err)
	}

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	// ... the business writes, in tx ...
	ids, err := w.WriteSQL(ctx, tx,
		outbox.Message{Topic: "orders.created", Key: "order-42", Payload: []byte(`{"order":42}`)},
		outbox.Message{Topic: "orders.paid", Key: "order-42", Payload: []byte(`{"order":42}`)},
	)
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	fmt.Println(len(ids), "messages written")
	// Output: 2 messages written
}

func ExampleValidateTopic() {
	fmt.Println(outbox.ValidateTopic("orders.created"))
	fmt.Println(outbox.ValidateTopic("orders.*"))
	// Output:
	// <nil>
	// invalid outbox message: topic: "orders.*" contains the NATS wildcard '*'
}

// exampleTable creates an outbox table in a new schema of its own and
// returns the database URL, the table's name and a func that drops it.
func exampleTable(ctx context.Context) (url, table string, cleanup func()) {
	url = os.Getenv("RELAY_TEST_DATABASE_URL")
	if url == "" {
		url = "postgres://root@127.0.0.1:5432/test?sslmode=disable"
	}
	db, err := sql.Open("pgx", url)
	if err != nil {
		log.Fatal(err)
	}
	t := schema.Table{Schema: "example_" + strings.ToLower(rand.Text()), Name: "outbox"}
	if _, err := schema.Up(ctx, db, t, nil); err != nil {
		log.Fatal(err)
	}
	return url, t.String(), func() {
		if _, err := db.ExecContext(ctx, `DROP SCHEMA "`+t.Schema+`" CASCADE`); err != nil {
			log.Print(err)
		}
		db.Close()
	}
}
