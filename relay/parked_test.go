package relay

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

// outbox retry forgets a row's route when no broker has a publish of it
// outstanding, so that a fixed topic is routed again; a broker that still
// owes it keeps the route its publish went by.
func TestRetryForgetsTheRouteOnlyWhenNothingIsOutstanding(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const routed = `, amqp_exchange = 'x', amqp_routing_key = 'k', nats_subject = 'old.s', nats_stream = 'S'`
	for _, tc := range []struct {
		name, set string
		kept      bool
	}{
		{"JetStream has it", `amqp_parked_at = now(), nats_delivered_at = now()`, false},
		{"parked for both", `amqp_parked_at = now(), nats_parked_at = now()`, false},
		{"JetStream's retry outstanding", `amqp_parked_at = now(), nats_retry_at = now() + interval '1 hour'`, true},
	} {
		id := f.insert(1, "orders.created")[0]
		f.setRow(id, tc.set+routed)
		var rowID int64
		if err := f.pool.QueryRow(context.Background(), `SELECT id FROM `+f.table.Owed()+` WHERE message_id = @message_id`, pgx.NamedArgs{"message_id": id}).Scan(&rowID); err != nil {
			t.Fatal(err)
		}
		if _, err := RetryParked(context.Background(), f.pool, f.table, []Target{TargetAMQP}, ParkedIDs(rowID)); err != nil {
			t.Fatal(err)
		}
		var subject *string
		if err := f.pool.QueryRow(context.Background(), `SELECT nats_subject FROM `+f.table.Owed()+` WHERE id = @id`, pgx.NamedArgs{"id": rowID}).Scan(&subject); err != nil {
			t.Fatal(err)
		}
		if kept := subject != nil; kept != tc.kept {
			t.Errorf("%s: route kept %v, want %v", tc.name, kept, tc.kept)
		}
	}
}
