package chaos

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit"
)

// sqlState returns the SQLSTATE of err, or "" if the server did not report one.
var sqlState = testkit.SQLState

// Scenario 7a: idle_in_transaction_session_timeout fires on a guarded write. The database
// default is set to 100 ms (ALTER DATABASE, then a fresh pool). A holder runs GuardTx and
// its fenced append, then leaves the transaction idle for 0..300 ms before (or, at random,
// between the fence and the write) committing; past the timeout the server ends the session,
// with it the guard's FOR SHARE lock on the lease row, and the holder's commit fails. A
// healthy contender takes the lease between the holder's grants. The timeout must fire, only
// on transactions left idle that long, and nothing a killed transaction wrote may reach the
// ledger.
func TestScenarioIdleInTransactionTimeout(t *testing.T) {
	t.Parallel()
	const idleTimeout = 100 * time.Millisecond
	e := setup(t, setupOpts{scenario: "7-idle-in-transaction-timeout",
		dbSet: fmt.Sprintf("idle_in_transaction_session_timeout = '%dms'", idleTimeout.Milliseconds())})
	ctx, db, pool, report := e.ctx, e.db, e.pool, e.report
	var setting string
	require.NoError(t, pool.QueryRow(ctx, `SHOW idle_in_transaction_session_timeout`).Scan(&setting))
	require.Equal(t, "100ms", setting)

	var fired, long atomic.Int64
	const ttl = time.Second
	for run := range runs(2) {
		name := fmt.Sprintf("idle:%d", run)
		// Setup, the recorder and the checks use db.Pool, without the workers' timeouts: a
		// harness statement cancelled by statement_timeout would fail the test for nothing.
		rec := newRun(t, ctx, db.Pool, name)
		// A run lasts 2.5 s and until the idler's first idle period (twice the timeout) has
		// ended and the next begun, bounded by a deadline no machine needs: on a loaded one the
		// idler may not be granted the lease in 2.5 s at all.
		wctx, stop := context.WithTimeout(ctx, 60*time.Second)
		minRun := time.Now().Add(2500 * time.Millisecond)
		var wg sync.WaitGroup
		backoff := backoffUpTo(20 * time.Millisecond)
		var calls atomic.Int64
		idle := func() {
			d := jitter(0, 3*idleTimeout)
			if calls.Add(1) == 1 {
				d = 2 * idleTimeout // at least one timeout per run
			}
			if d > idleTimeout-10*time.Millisecond { // may fire (the client adds a little idle time)
				long.Add(1)
			}
			time.Sleep(d)
		}
		idler := &idleWorker{leaseWorker: leaseWorker{rec: rec, pool: pool, worker: "idler", name: name, ttl: ttl, writes: 3, guard: true,
			opts: []fencelock.LessorOption{backoff}}, idle: idle}
		healthy := &leaseWorker{rec: rec, pool: pool, worker: "healthy", name: name, ttl: ttl, writes: 3, gap: 5 * time.Millisecond, guard: true,
			opts: []fencelock.LessorOption{backoff}}
		wg.Go(func() { idler.run(wctx) })
		wg.Go(func() { healthy.run(wctx) })
		wg.Go(func() {
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for wctx.Err() == nil {
				if calls.Load() >= 2 && !time.Now().Before(minRun) {
					stop()
					return
				}
				select {
				case <-wctx.Done():
				case <-tick.C:
				}
			}
		})
		wg.Wait()
		stop()
		h := finalCheck(t, ctx, pool, rec, report, name)
		for _, op := range h {
			if op.Kind == KindAppend && op.Worker == "idler" && op.Outcome != OK && op.Err != "" && (strings.Contains(op.Err, "25P03") || strings.Contains(op.Err, "idle-in-transaction")) {
				fired.Add(1)
				// The server ends a transaction idle for the timeout: one that failed so lasted
				// at least that long, however slow the machine (a failure of a shorter one was
				// misread).
				if op.Outcome == Fail {
					require.GreaterOrEqual(t, op.Return-op.Invoke, idleTimeout, "an append failed on the idle timeout though its transaction lasted less than the timeout: %+v", op)
				}
			}
		}
	}
	require.Positive(t, fired.Load(), "idle_in_transaction_session_timeout never fired")
	t.Logf("chaos: scenario=%s idle_timeout=%v idle_periods_near_or_over_timeout=%d commits_failed_by_timeout=%d", report.Scenario, idleTimeout, long.Load(), fired.Load())
	logReport(t, report)
}

// idleWorker is a leaseWorker whose appends leave their transaction idle, at random before
// the write (after the guard and the fence) or after it (before the commit).
type idleWorker struct {
	leaseWorker
	idle func()
}

// run is leaseWorker.run with an Appender that idles.
func (w *idleWorker) run(ctx context.Context) {
	l, err := fencelock.NewLessor(w.pool, append([]fencelock.LessorOption{fencelock.WithHolder(w.worker)}, w.opts...)...)
	if err != nil {
		panic(err)
	}
	var watchers sync.WaitGroup
	defer watchers.Wait()
	app := &Appender{Pool: w.pool, Rec: w.rec, Worker: w.worker, Holder: w.worker}
	for ctx.Err() == nil {
		lease, ok := acquireRecorded(ctx, w.rec, l, w.worker, w.name, w.ttl)
		if !ok {
			sleepCtx(ctx, 10*time.Millisecond)
			continue
		}
		watchers.Go(func() { w.watch(lease) })
		app.Guard = lease.GuardTx
		for range w.writes {
			if !checkHeld(w.rec, w.worker, lease) {
				break
			}
			if app.seq%2 == 0 {
				app.BeforeWrite, app.AfterWrite = w.idle, nil
			} else {
				app.BeforeWrite, app.AfterWrite = nil, w.idle
			}
			_ = app.Append(ctx, w.name, lease.Token())
		}
		releaseRecorded(w.rec, w.worker, lease)
	}
}

// Scenario 7b: lock_timeout and statement_timeout fire. The holders' sessions run with
// lock_timeout = 10 ms and statement_timeout = 50 ms (pgx RuntimeParams: per session). Lease
// workers (Acquire, heartbeat, GuardTx) share one name with RunLocked and TryRunLocked
// workers whose transaction makes a fenced append and sometimes sleeps past the statement
// timeout or holds the lease row while others queue on it past the lock timeout. Each call
// succeeds, or fails with a clear error (lock not available, statement cancelled) that changed
// nothing; no token is granted twice and no stale write is accepted.
func TestScenarioLockAndStatementTimeout(t *testing.T) {
	t.Parallel()
	e := setup(t, setupOpts{scenario: "7-lock-statement-timeout", poolConfig: func(cfg *pgxpool.Config) {
		cfg.ConnConfig.RuntimeParams["lock_timeout"] = "10ms"
		cfg.ConnConfig.RuntimeParams["statement_timeout"] = "50ms"
	}})
	ctx, db, pool, report := e.ctx, e.db, e.pool, e.report
	var lockT, stmtT string
	require.NoError(t, pool.QueryRow(ctx, `SELECT current_setting('lock_timeout'), current_setting('statement_timeout')`).Scan(&lockT, &stmtT))
	require.Equal(t, []string{"10ms", "50ms"}, []string{lockT, stmtT})

	fired := map[string]int{}
	var firedMu sync.Mutex
	count := func(err error) {
		if code := sqlState(err); code == "55P03" || code == "57014" {
			firedMu.Lock()
			fired[code]++
			firedMu.Unlock()
		}
	}
	for run := range runs(2) {
		name := fmt.Sprintf("tmo:%d", run)
		// Setup, the recorder and the checks use db.Pool, without the workers' timeouts: a
		// harness statement cancelled by statement_timeout would fail the test for nothing.
		rec := newRun(t, ctx, db.Pool, name)
		wctx, stop := context.WithTimeout(ctx, 2500*time.Millisecond)
		var wg sync.WaitGroup
		backoff := backoffUpTo(20 * time.Millisecond)
		for i := range 2 {
			w := &leaseWorker{rec: rec, pool: pool, worker: fmt.Sprintf("lease%d", i), name: name, ttl: 300 * time.Millisecond, writes: 2, gap: 5 * time.Millisecond, guard: true,
				opts: []fencelock.LessorOption{backoff}}
			wg.Go(func() { w.run(wctx) })
		}
		for i := range 3 {
			w := &txWorker{rec: rec, pool: pool, worker: fmt.Sprintf("tx%d", i), name: name, try: i == 2, count: count, opts: []fencelock.LessorOption{backoff}}
			wg.Go(func() { w.run(wctx) })
		}
		wg.Wait()
		stop()
		h := finalCheck(t, ctx, db.Pool, rec, report, name)
		for _, op := range h {
			if op.Kind == KindGrant && strings.HasPrefix(op.Worker, "tx") && op.Outcome == OK && op.Token == 0 {
				t.Errorf("RunLocked grant without a token: %v", op)
			}
		}
	}
	firedMu.Lock()
	defer firedMu.Unlock()
	require.Positive(t, fired["57014"], "statement_timeout never fired")
	t.Logf("chaos: scenario=%s lock_timeout=10ms statement_timeout=50ms lock_timeouts_fired=%d statement_timeouts_fired=%d", report.Scenario, fired["55P03"], fired["57014"])
	logReport(t, report)
}

// txWorker runs RunLocked (or TryRunLocked) in a loop; its function makes a fenced append
// and then, one call in four, sleeps past the statement timeout (pg_sleep 80 ms: the
// statement is cancelled, the transaction rolls back) and one in four holds the row for
// 30 ms (others' grants queue past their lock timeout).
type txWorker struct {
	rec    *Recorder
	pool   *pgxpool.Pool
	worker string
	name   string
	try    bool
	count  func(error)
	opts   []fencelock.LessorOption
}

func (w *txWorker) run(ctx context.Context) {
	l, err := fencelock.NewLessor(w.pool, append([]fencelock.LessorOption{fencelock.WithHolder(w.worker)}, w.opts...)...)
	if err != nil {
		panic(err)
	}
	for seq := 0; ctx.Err() == nil; seq++ {
		invoked := w.rec.Now()
		appendID := -1
		var token fencelock.Token
		var fnErr error
		var at time.Time
		fn := func(ctx context.Context, tx pgx.Tx, tok fencelock.Token) error {
			token = tok
			value := Entry(w.worker, tok, fmt.Sprintf("%s-%d", w.worker, seq))
			appendID = w.rec.Invoke(Op{Worker: w.worker, Kind: KindAppend, Name: w.name, Token: int64(tok), Holder: w.worker, Value: value})
			fnErr = func() error {
				if err := fencelock.FenceTx(ctx, tx, w.name, tok); err != nil {
					return err
				}
				if err := tx.QueryRow(ctx, `UPDATE ledger SET entries = entries || $2::text WHERE resource = $1 RETURNING clock_timestamp()`, w.name, value).Scan(&at); err != nil {
					return err
				}
				switch seq % 4 {
				case 0:
					_, err := tx.Exec(ctx, `SELECT pg_sleep(0.08)`) // past statement_timeout
					return err
				case 1:
					_, err := tx.Exec(ctx, `SELECT pg_sleep(0.03)`) // holds the row past others' lock_timeout
					return err
				}
				return nil
			}()
			return fnErr
		}
		if w.try {
			err = l.TryRunLocked(ctx, w.name, fn)
		} else {
			err = l.RunLocked(ctx, w.name, fn)
		}
		w.count(err)
		if appendID >= 0 {
			outcome := Classify(err)
			if fnErr != nil && errors.Is(err, fnErr) {
				outcome = Fail // fn's error: rolled back, never committed
			}
			w.rec.Complete(appendID, outcome, err, func(op *Op) {
				op.ServerAt = at
				var stale *fencelock.StaleTokenError
				if errors.As(err, &stale) {
					op.Stale, op.Current = true, int64(stale.Current)
				}
			})
		}
		if err == nil { // the grant committed with the append: record it as a grant
			now := w.rec.Now()
			w.rec.Record(Op{Worker: w.worker, Kind: KindGrant, Name: w.name, Holder: w.worker, Token: int64(token), Outcome: OK, Invoke: invoked, Return: now})
		}
		sleepCtx(ctx, 2*time.Millisecond)
	}
}
