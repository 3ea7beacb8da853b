package job_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/job"
)

// beforeClaim is a pgx tracer that runs f when a job's claim statement (sqlc's JobClaim)
// starts: a moment between the job's grant, committed, and its claim of the slot.
type beforeClaim struct{ f func() }

func (c beforeClaim) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.HasPrefix(d.SQL, "-- name: JobClaim ") {
		c.f()
	}
	return ctx
}

func (c beforeClaim) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// expireLease ends the grant of name on the database behind its holder's back, as an expiry
// that the holder's trust window has not seen yet (a clock jump, a pause of the renewals).
func expireLease(t *testing.T, b *bundle, name string) {
	t.Helper()
	_, err := b.Pool.Exec(b.Ctx, `UPDATE fencelock.leases SET expires_at = clock_timestamp() - interval '1 second' WHERE name = $1`, name)
	require.NoError(t, err)
}

// requireGoneOnServer checks that err and lease report the loss a ledger statement found: the
// grant gone on the database, while the holder still trusted it. The lease has ended as lost
// (its Done closed), not merely released.
func requireGoneOnServer(t *testing.T, err error, lease *fencelock.Lease) {
	t.Helper()
	require.ErrorIs(t, err, fencelock.ErrLeaseLost)
	var lost *fencelock.LeaseLostError
	require.ErrorAs(t, err, &lost)
	require.Equal(t, lease.Token(), lost.Token)
	require.Equal(t, "the database no longer has this grant (expired or taken over)", lost.Cause.Error())
	select {
	case <-lease.Done():
	default:
		t.Fatal("the lease's Done is open after the database said its grant is gone")
	}
	require.ErrorIs(t, lease.Err(), fencelock.ErrLeaseLost, "the lease ended as released, not as lost")
}

// A run whose grant the database no longer has when the run ends (expired behind the holder's
// back, its trust window still open) records nothing: the slot reads crashed, RunSlot's error
// and the run's lease say the lease was lost.
func TestJobGrantGoneAtFinish(t *testing.T) {
	t.Parallel()
	b := setup(t)
	slot := time.Date(2026, 11, 23, 14, 0, 0, 0, time.UTC)
	j := newJob(t, b, "gone-finish", "job:gone-finish", 10*time.Second, []fencelock.LessorOption{fencelock.WithoutHeartbeat()})
	var lease *fencelock.Lease
	err := j.RunSlot(b.Ctx, slot, func(ctx context.Context, run *job.Run) error {
		lease = run.Lease
		expireLease(t, b, "job:gone-finish")
		return nil
	})
	require.NotNil(t, lease)
	require.ErrorContains(t, err, "outcome not recorded")
	requireGoneOnServer(t, err, lease)
	outcome, _ := ledger(t, b, "job:gone-finish", slot)
	require.Equal(t, "crashed", outcome)
}

// A grant the database no longer has when the slot is claimed (expired between the grant and
// the claim): fn is not called, the slot is left unclaimed for a later run, and RunSlot's error
// says the lease was lost.
func TestJobGrantGoneAtClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	slot := time.Date(2026, 11, 23, 15, 0, 0, 0, time.UTC)
	var once sync.Once
	cfg, err := pgxpool.ParseConfig(b.DB.URL)
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = beforeClaim{f: func() { once.Do(func() { expireLease(t, b, "job:gone-claim") }) }}
	pool, err := pgxpool.NewWithConfig(b.Ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	l := newLessor(t, pool, "gone-claim", fencelock.WithoutHeartbeat())
	j, err := job.New(l, "job:gone-claim", 10*time.Second)
	require.NoError(t, err)
	err = j.RunSlot(b.Ctx, slot, func(context.Context, *job.Run) error {
		return errors.New("fn must not run")
	})
	require.ErrorIs(t, err, fencelock.ErrLeaseLost)
	require.NotErrorIs(t, err, job.ErrSlotDone)
	var lost *fencelock.LeaseLostError
	require.ErrorAs(t, err, &lost)
	require.Equal(t, "the database no longer has this grant (expired or taken over)", lost.Cause.Error())
	var rows int
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM fencelock.job_runs WHERE job = 'job:gone-claim'`).Scan(&rows))
	require.Zero(t, rows, "the slot was claimed")
	// The slot is still to run: a later run (the tracer has fired) takes it, attempt 1.
	require.NoError(t, j.RunSlot(b.Ctx, slot, func(_ context.Context, run *job.Run) error {
		require.Equal(t, 1, run.Attempt)
		return nil
	}))
	outcome, _ := ledger(t, b, "job:gone-claim", slot)
	require.Equal(t, "succeeded", outcome)
}
