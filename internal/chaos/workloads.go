package chaos

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock"
)

// SetupInventory creates the inventory table, stock(item, qty) with qty >= 0 enforced, and
// stocks every item with initial units.
func SetupInventory(ctx context.Context, pool *pgxpool.Pool, initial int, items ...string) error {
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS stock (item text PRIMARY KEY, qty int NOT NULL CHECK (qty >= 0))`); err != nil {
		return fmt.Errorf("create stock: %w", err)
	}
	_, err := pool.Exec(ctx, `INSERT INTO stock (item, qty) SELECT unnest($1::text[]), $2`, items, initial)
	if err != nil {
		return fmt.Errorf("insert stock: %w", err)
	}
	return nil
}

// Decrement takes amount units of item under a fence: in one transaction, FenceTx(item,
// token), then read the stock and write it back lowered (a read-modify-write that only the
// fence and the lock keep safe; the CHECK constraint is a last line). It returns false, and
// changes nothing, when the stock is short. The operation is recorded as KindDecrement.
func Decrement(ctx context.Context, pool *pgxpool.Pool, rec *Recorder, worker, item string, token fencelock.Token, amount int) (bool, error) {
	id := rec.Invoke(Op{Worker: worker, Kind: KindDecrement, Name: item, Token: int64(token), Amount: amount})
	short := false
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := fencelock.FenceTx(ctx, tx, "stock:"+item, token); err != nil {
			return err
		}
		var qty int
		if err := tx.QueryRow(ctx, `SELECT qty FROM stock WHERE item = $1`, item).Scan(&qty); err != nil {
			return err
		}
		if qty < amount {
			short = true
			return nil
		}
		_, err := tx.Exec(ctx, `UPDATE stock SET qty = $2 WHERE item = $1`, item, qty-amount)
		return err
	})
	outcome := Classify(err)
	if short {
		outcome = Fail
	}
	rec.Complete(id, outcome, err, func(op *Op) { op.Stale = isStale(err) })
	return !short && err == nil, err
}

// StockConserved checks the inventory: no item's final stock is negative, and for each item
// initial = final + the acknowledged decrements + some subset of the decrements whose
// outcome is unknown.
func StockConserved(h History, initial int, final map[string]int) []Violation {
	var vs []Violation
	acked := map[string]int{}
	unknown := map[string][]int{}
	for _, op := range h {
		if op.Kind != KindDecrement {
			continue
		}
		switch op.Outcome {
		case OK:
			acked[op.Name] += op.Amount
		case Unknown, Pending:
			unknown[op.Name] = append(unknown[op.Name], op.Amount)
		}
	}
	for item, qty := range final {
		if qty < 0 {
			vs = append(vs, Violation{"StockConserved", -1, fmt.Sprintf("stock of %q is %d", item, qty)})
			continue
		}
		missing := initial - qty - acked[item]
		if !subsetSum(unknown[item], missing) {
			vs = append(vs, Violation{"StockConserved", -1, fmt.Sprintf("stock of %q: initial %d, final %d, acknowledged %d: %d units unaccounted for by unknown decrements %v", item, initial, qty, acked[item], missing, unknown[item])})
		}
	}
	return vs
}

// subsetSum reports whether some subset of xs (all > 0) sums to target.
func subsetSum(xs []int, target int) bool {
	if target < 0 {
		return false
	}
	reach := make([]bool, target+1)
	reach[0] = true
	for _, x := range xs {
		for s := target; s >= x; s-- {
			reach[s] = reach[s] || reach[s-x]
		}
	}
	return reach[target]
}

// SetupPayments creates the payments tables: orders(id, status) with every order pending,
// and captures(order_id, op), one row per capture, deliberately without a unique constraint
// so that only the lock and the fence keep captures at most once.
func SetupPayments(ctx context.Context, pool *pgxpool.Pool, orders ...string) error {
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, status text NOT NULL);
		CREATE TABLE IF NOT EXISTS captures (order_id text NOT NULL, op text NOT NULL)`); err != nil {
		return fmt.Errorf("create payments: %w", err)
	}
	_, err := pool.Exec(ctx, `INSERT INTO orders (id, status) SELECT unnest($1::text[]), 'pending'`, orders)
	if err != nil {
		return fmt.Errorf("insert orders: %w", err)
	}
	return nil
}

// Capture captures order under a fence, at most once: in one transaction, FenceTx(order,
// token), read the order's status and, if pending, insert a capture and mark it captured.
// It returns whether this call captured. Recorded as KindCapture (Value: the op id).
func Capture(ctx context.Context, pool *pgxpool.Pool, rec *Recorder, worker, order string, token fencelock.Token, opid string) (bool, error) {
	id := rec.Invoke(Op{Worker: worker, Kind: KindCapture, Name: order, Token: int64(token), Value: opid})
	captured := false
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := fencelock.FenceTx(ctx, tx, "order:"+order, token); err != nil {
			return err
		}
		var status string
		if err := tx.QueryRow(ctx, `SELECT status FROM orders WHERE id = $1`, order).Scan(&status); err != nil {
			return err
		}
		if status != "pending" {
			return nil
		}
		captured = true
		_, err := tx.Exec(ctx, `INSERT INTO captures (order_id, op) VALUES ($1, $2); `, order, opid)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE orders SET status = 'captured' WHERE id = $1`, order)
		return err
	})
	outcome := Classify(err)
	if err == nil && !captured {
		outcome = Fail // nothing to capture: changed nothing
	}
	rec.Complete(id, outcome, err, func(op *Op) { op.Stale = isStale(err) })
	return captured && err == nil, err
}

// CapturedAtMostOnce checks the payments: every order has at most one capture row, every
// acknowledged capture is the one recorded, and no capture that definitely failed is there.
// captures maps each order to the op ids of its capture rows.
func CapturedAtMostOnce(h History, captures map[string][]string) []Violation {
	var vs []Violation
	for order, ops := range captures {
		if len(ops) > 1 {
			vs = append(vs, Violation{"CapturedAtMostOnce", -1, fmt.Sprintf("order %q captured %d times: %v", order, len(ops), ops)})
		}
	}
	for _, op := range h {
		if op.Kind != KindCapture {
			continue
		}
		n := count(captures[op.Name], op.Value)
		switch {
		case op.Outcome == OK && n != 1:
			vs = append(vs, Violation{"CapturedAtMostOnce", op.ID, fmt.Sprintf("acknowledged capture %s of %q not recorded", op.Value, op.Name)})
		case op.Outcome == Fail && n != 0:
			vs = append(vs, Violation{"CapturedAtMostOnce", op.ID, fmt.Sprintf("failed capture %s of %q was applied", op.Value, op.Name)})
		}
	}
	return vs
}

// ReadStock returns the final stock of every item.
func ReadStock(ctx context.Context, pool *pgxpool.Pool) (map[string]int, error) {
	rows, err := pool.Query(ctx, `SELECT item, qty FROM stock`)
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	var item string
	var qty int
	_, err = pgx.ForEachRow(rows, []any{&item, &qty}, func() error { out[item] = qty; return nil })
	return out, err
}

// ReadCaptures returns the op ids of the capture rows of every order.
func ReadCaptures(ctx context.Context, pool *pgxpool.Pool) (map[string][]string, error) {
	rows, err := pool.Query(ctx, `SELECT order_id, op FROM captures`)
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	var order, op string
	_, err = pgx.ForEachRow(rows, []any{&order, &op}, func() error { out[order] = append(out[order], op); return nil })
	return out, err
}

// sleepCtx sleeps d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func isStale(err error) bool { return errors.Is(err, fencelock.ErrStaleToken) }
