package main

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// postgresCeiling fills the corner's outbox with n rows and has
// pgClaimWorkers workers claim them pgClaimBatch at a time, the way relayd
// claims fresh rows (FOR UPDATE SKIP LOCKED along the primary key, the same
// columns),
// and delete them, one transaction per batch.
func (b *bench) postgresCeiling(ctx context.Context, cr *corner, n int) (Ceiling, error) {
	c := Ceiling{Key: ceilPostgres, Messages: n,
		Name: fmt.Sprintf("Postgres claim (FOR UPDATE SKIP LOCKED, %d rows a batch, relayd's columns and walk) + delete, %d workers", pgClaimBatch, pgClaimWorkers)}
	if err := cr.fill(ctx, n, 0); err != nil {
		return c, err
	}
	tbl := cr.table.Ident()
	claim := `SELECT id, message_id::text, topic, key, headers::text, payload, created_at FROM ` + tbl + `
	WHERE key IS NULL ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED`
	del := `DELETE FROM ` + tbl + ` WHERE id = ANY($1::bigint[])`

	var mu sync.Mutex
	total := 0
	var firstErr error
	var wg sync.WaitGroup
	snap := takeCPUSnap()
	start := time.Now()
	for range pgClaimWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				got, err := b.claimDelete(ctx, claim, del)
				mu.Lock()
				total += got
				if err != nil && firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
				if err != nil || got == 0 {
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	c.CPU = cpuSplit(snap, takeCPUSnap(), n)
	if firstErr != nil {
		return c, firstErr
	}
	if total != n {
		return c, fmt.Errorf("claimed %d rows, want %d", total, n)
	}
	c.measured(n, elapsed)
	return c, nil
}

func (b *bench) claimDelete(ctx context.Context, claim, del string) (int, error) {
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	rows, err := tx.Query(ctx, claim, pgClaimBatch)
	if err != nil {
		return 0, err
	}
	var ids []int64
	for rows.Next() {
		var (
			id           int64
			msgID, topic string
			key, headers *string
			payload      []byte
			createdAt    time.Time
		)
		if err := rows.Scan(&id, &msgID, &topic, &key, &headers, &payload, &createdAt); err != nil {
			rows.Close()
			return 0, err
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	if len(ids) == 0 {
		return 0, tx.Commit(ctx)
	}
	if _, err := tx.Exec(ctx, del, ids); err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, err
	}
	return len(ids), nil
}
