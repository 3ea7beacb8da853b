package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock"
)

// errNotPending rolls back a capture whose payment was captured by someone else already.
var errNotPending = errors.New("payment is not pending")

// capture captures payment id in one transaction: fence, check, update, append. fence is
// lease.FenceTx for a lease holder (the pattern to copy). It reports whether it captured the
// payment (false: it was no longer pending). A lost lease comes back as a
// *fencelock.LeaseLostError, a stale token as a *fencelock.StaleTokenError, with the
// transaction rolled back.
func capture(ctx context.Context, pool *pgxpool.Pool, fence func(context.Context, pgx.Tx) error, token fencelock.Token, holder string, id int) (bool, error) {
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// The fence: checks the lease is still ours and advances fencelock.fences("payment:<id>")
		// to our token, or fails. Its rows stay locked until commit, so fenced writers of one
		// payment run one after the other and the check below sees the previous capture.
		if err := fence(ctx, tx); err != nil {
			return err
		}
		var status string
		if err := tx.QueryRow(ctx, `SELECT status FROM payments WHERE id = $1`, id).Scan(&status); err != nil {
			return fmt.Errorf("read payment %d: %w", id, err)
		}
		if status != "pending" {
			return errNotPending
		}
		if _, err := tx.Exec(ctx,
			`UPDATE payments SET status = 'captured', captured_by = $2, captured_token = $3 WHERE id = $1`,
			id, holder, int64(token)); err != nil {
			return fmt.Errorf("capture payment %d: %w", id, err)
		}
		if _, err := tx.Exec(ctx,
			`INSERT INTO payment_captures (payment_id, worker, token) VALUES ($1, $2, $3)`,
			id, holder, int64(token)); err != nil {
			return fmt.Errorf("record capture of payment %d: %w", id, err)
		}
		return nil
	})
	if errors.Is(err, errNotPending) {
		return false, nil
	}
	return err == nil, err
}

// recordRejection notes a rejected fenced write, in a transaction of its own (the rejected
// one was rolled back), so the summary counts rejections from the database.
func recordRejection(ctx context.Context, pool *pgxpool.Pool, id int, holder string, stale *fencelock.StaleTokenError) error {
	_, err := pool.Exec(ctx,
		`INSERT INTO stale_rejections (payment_id, worker, token, current_token) VALUES ($1, $2, $3, $4)`,
		id, holder, int64(stale.Token), int64(stale.Current))
	if err != nil {
		return fmt.Errorf("record stale rejection of payment %d: %w", id, err)
	}
	return nil
}

func pendingPayments(ctx context.Context, pool *pgxpool.Pool) ([]int, error) {
	rows, err := pool.Query(ctx, `SELECT id FROM payments WHERE status = 'pending' ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("list pending payments: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return nil, fmt.Errorf("list pending payments: %w", err)
	}
	return ids, nil
}
