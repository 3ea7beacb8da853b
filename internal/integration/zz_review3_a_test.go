package integration

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
)

// R1: a context taken after the lease ended is not cancelled on return; and right after
// lease.Err() ends the lease, ctx.Err() is still nil.
func TestZZReview3CtxLag(t *testing.T) {
	b := setup(t)
	l := newLessor(t, b.pool, "r-lag")
	lease, err := l.TryAcquire(b.ctx, "r:lag", 5*time.Second)
	require.NoError(t, err)
	require.NoError(t, lease.Release(b.ctx))
	nilAfterEnd := 0
	for range 1000 {
		ctx, cancel := lease.Context(b.ctx)
		if ctx.Err() == nil {
			nilAfterEnd++
		}
		cancel()
	}
	t.Logf("context of an ended lease: Err()==nil on return %d/1000", nilAfterEnd)

	z := newLessor(t, b.pool, "r-lag2", fencelock.WithoutHeartbeat())
	lag := 0
	for i := range 5 {
		lz, err := z.TryAcquire(b.ctx, "r:lag2", 200*time.Millisecond)
		require.NoError(t, err)
		ctx, cancel := lz.Context(b.ctx)
		for time.Now().Before(lz.TrustedUntil()) {
		}
		e1 := lz.Err()
		e2 := ctx.Err()
		if e1 != nil && e2 == nil {
			lag++
		}
		t.Logf("run %d: lease.Err=%v ctx.Err=%v", i, e1 != nil, e2)
		cancel()
		_ = lz.Release(b.ctx)
	}
	t.Logf("lease.Err()!=nil while ctx.Err()==nil: %d/5", lag)
}

// R2: a panic in fn leaves the lease held (renewed) after recovery.
func TestZZReview3RunLeasedPanic(t *testing.T) {
	b := setup(t)
	l := newLessor(t, b.pool, "r-panic", fencelock.WithHeartbeatInterval(100*time.Millisecond))
	var leased *fencelock.Lease
	func() {
		defer func() { t.Logf("recovered: %v", recover()) }()
		_ = l.RunLeased(b.ctx, "r:panic", 500*time.Millisecond, func(ctx context.Context, lease *fencelock.Lease) error {
			leased = lease
			panic("boom")
		})
	}()
	time.Sleep(2 * time.Second)
	row := readLease(t, b.ctx, b.pool, "r:panic")
	t.Logf("2 s (4 TTLs) after the panic: holder=%s expired=%v lease.Err=%v", row.Holder, row.Expired, leased.Err())
	o := newLessor(t, b.pool, "r-panic-other")
	_, err := o.TryAcquire(b.ctx, "r:panic", time.Second)
	t.Logf("other TryAcquire: %v", err)
}

// R3: fn returns ctx.Err() after the loss: RunLeased reports context.Canceled, not the loss.
func TestZZReview3RunLeasedCtxErr(t *testing.T) {
	b := setup(t)
	z := newLessor(t, b.pool, "r-ctxerr", fencelock.WithoutHeartbeat())
	err := z.RunLeased(b.ctx, "r:ctxerr", 300*time.Millisecond, func(ctx context.Context, _ *fencelock.Lease) error {
		<-ctx.Done()
		return ctx.Err()
	})
	t.Logf("err=%v is ErrLeaseLost=%v is Canceled=%v", err, errors.Is(err, fencelock.ErrLeaseLost), errors.Is(err, context.Canceled))
}

// R4: a value with NUL or invalid UTF-8 is not refused before SQL: the term is acquired first.
func TestZZReview3BadValue(t *testing.T) {
	b := setup(t)
	e := newElection(t, b, "r-bad", "r:bad", time.Second)
	for _, v := range []string{"a\x00b", "\xff\xfe"} {
		_, err := e.Campaign(b.ctx, v)
		t.Logf("Campaign(%q): %v; ArgumentError=%v", v, err, errors.Is(err, fencelock.ErrInvalidArgument))
	}
	var tok int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT token FROM fencelock.leases WHERE name='r:bad'`).Scan(&tok))
	t.Logf("lease row token after the bad campaigns: %d (a term was granted)", tok)
	ctx, cancel := context.WithTimeout(b.ctx, 1500*time.Millisecond)
	defer cancel()
	var started atomic.Int32
	err := e.Run(ctx, "a\x00b", fencelock.ElectionCallbacks{OnStartedLeading: func(context.Context, *fencelock.Term) { started.Add(1) }})
	var tok2 int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT token FROM fencelock.leases WHERE name='r:bad'`).Scan(&tok2))
	t.Logf("Run with a NUL value returned %v after 1.5 s; tokens drawn meanwhile: %d", err, tok2-tok)
}

type cancelOnProclaim struct {
	armed  atomic.Bool
	cancel context.CancelFunc
}

func (c *cancelOnProclaim) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "name: ElectionProclaim") {
		return context.WithValue(ctx, c, true)
	}
	return ctx
}

func (c *cancelOnProclaim) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	if ctx.Value(c) != nil && d.Err == nil && c.armed.Load() {
		c.cancel()
	}
}

// R5: ctx ends just after Campaign succeeded: Run returns and the term stays held.
func TestZZReview3RunLeaksTerm(t *testing.T) {
	b := setup(t)
	cfg, err := pgxpool.ParseConfig(b.db.URL)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	tr := &cancelOnProclaim{cancel: cancel}
	tr.armed.Store(true)
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	l := newLessor(t, pool, "r-leak", fencelock.WithHeartbeatInterval(100*time.Millisecond))
	e, err := fencelock.NewElection(l, "r:leak", 500*time.Millisecond)
	require.NoError(t, err)
	var started atomic.Int32
	err = e.Run(ctx, "v", fencelock.ElectionCallbacks{OnStartedLeading: func(context.Context, *fencelock.Term) { started.Add(1) }})
	t.Logf("Run returned %v; OnStartedLeading called %d times", err, started.Load())
	time.Sleep(2 * time.Second)
	info, lerr := e.Leader(b.ctx)
	t.Logf("2 s (4 TTLs) after Run returned: leader=%+v err=%v", info, lerr)
	o := newLessor(t, b.pool, "r-leak-other")
	_, err = o.TryAcquire(b.ctx, "r:leak", time.Second)
	t.Logf("other TryAcquire: %v", err)
}

// R6: a renewal whose WHERE ran before the expiry and that commits after the observer's read at
// expiry: the observer says nobody leads and then waits a day.
func TestZZReview3ObserveMissesRenewal(t *testing.T) {
	b := setup(t)
	a := newElection(t, b, "r-obs-a", "r:obs", time.Second, fencelock.WithoutHeartbeat())
	w := newElection(t, b, "r-obs-w", "r:obs", time.Second)
	ta, err := a.Campaign(b.ctx, "A")
	require.NoError(t, err)
	states := w.Observe(b.ctx)
	require.Equal(t, "A", nextWhere(t, states, 0, func(i fencelock.LeaderInfo) bool { return i.Value == "A" }).Value)
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	tag, err := tx.Exec(b.ctx, `UPDATE fencelock.leases SET expires_at = clock_timestamp() + interval '10 s' WHERE name='r:obs' AND token=$1 AND expires_at > clock_timestamp()`, int64(ta.Token()))
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())
	got := next(t, states)
	t.Logf("observer at expiry: %+v", got)
	require.NoError(t, tx.Commit(b.ctx))
	info, err := w.Leader(b.ctx)
	t.Logf("after the renewal committed, Leader: %s %d err=%v", info.Holder, info.Token, err)
	select {
	case s := <-states:
		t.Logf("observer delivered %+v", s)
	case <-time.After(3 * time.Second):
		t.Logf("observer delivered nothing in 3 s while %s leads", info.Holder)
	}
}
