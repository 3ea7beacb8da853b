package fencelock_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit"
)

// poolWithApp returns a pool whose sessions carry application_name app, for triggers that
// stall one client's statements.
func poolWithApp(t *testing.T, url, app string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

// stallRenewals installs a statement trigger on fencelock.leases that makes the UPDATEs of the
// sessions named app sleep seconds, from the first'th UPDATE on (1: the grant). It stands in
// for a renewal held up on the server (a relation lock, I/O) after its transaction started.
func stallRenewals(t *testing.T, b *bundle, app string, first, last int, seconds float64) {
	t.Helper()
	_, err := b.Pool.Exec(b.Ctx, `
CREATE SEQUENCE public.stall_seq;
CREATE FUNCTION public.stall() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE n bigint;
BEGIN
  IF current_setting('application_name') = '`+app+`' THEN
    n := nextval('public.stall_seq');
    IF n BETWEEN `+itoa(first)+` AND `+itoa(last)+` THEN PERFORM pg_sleep(`+ftoa(seconds)+`); END IF;
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER stall BEFORE UPDATE ON fencelock.leases FOR EACH STATEMENT EXECUTE FUNCTION public.stall();`)
	require.NoError(t, err)
}

// Two renewals of one lease that overlap (the heartbeat's and a Lease.Renew; here two Renew
// calls) never move its expiry back: the one that commits last may have started first, and
// now() is its transaction's start. The holder trusts the later window, so the database must
// keep the later expiry. Before greatest() in LeaseRenew, a second lessor was granted the name
// while the first still trusted it for 0.7 s more. (Found by review.)
func TestOverlappingRenewalsNeverMoveExpiryBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// The first renewal stalls in a statement trigger until the test lets it go: a gate (an
	// advisory lock the test holds), not a sleep, so that it commits after the second however
	// slow the machine (with a 1.5 s sleep, a loaded machine let it wake and lock the row
	// before the second came, which then found the row locked).
	const gateKey = 424242
	gate, _ := testkit.Conn(t, b.Ctx, b.Pool)
	_, err := gate.Exec(b.Ctx, `SELECT pg_advisory_lock($1)`, gateKey)
	require.NoError(t, err)
	_, err = b.Pool.Exec(b.Ctx, `
CREATE SEQUENCE public.gate_seq;
CREATE FUNCTION public.gate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF current_setting('application_name') = 'holder1' AND nextval('public.gate_seq') = 2 THEN
    PERFORM pg_advisory_xact_lock(`+itoa(gateKey)+`);
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER gate BEFORE UPDATE ON fencelock.leases FOR EACH STATEMENT EXECUTE FUNCTION public.gate();`)
	require.NoError(t, err)
	l1 := newLessor(t, poolWithApp(t, b.DB.URL, "holder1"), "h1", fencelock.WithoutHeartbeat())
	l2 := newLessor(t, b.Pool, "h2")
	lease, err := l1.TryAcquire(b.Ctx, "x", 3*time.Second)
	require.NoError(t, err)
	stalled := make(chan error, 1)
	go func() { stalled <- lease.Renew(b.Ctx) }()
	require.Eventually(t, func() bool { // the stalled renewal waits at the gate
		var n int
		err := b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'holder1' AND wait_event = 'advisory'`).Scan(&n)
		return err == nil && n == 1
	}, 10*time.Second, 5*time.Millisecond)
	// Staging: the second renewal starts 1 s after the stalled one, so its expiry is later by
	// more than the 300 ms safety margin, and an expiry moved back would leave the first holder
	// trusting a lease the database has already given up (by about 0.7 s).
	time.Sleep(time.Second)
	require.NoError(t, lease.Renew(b.Ctx)) // commits first, with the later expiry
	_, err = gate.Exec(b.Ctx, `SELECT pg_advisory_unlock($1)`, gateKey)
	require.NoError(t, err)
	require.NoError(t, <-stalled) // commits last, with the earlier now()
	for {
		taken, err := l2.TryAcquire(b.Ctx, "x", time.Second)
		if err == nil {
			require.Error(t, lease.Err(), "two holders: the first still trusts its lease for %v after the second was granted", time.Until(lease.TrustedUntil()))
			require.NoError(t, taken.Release(b.Ctx))
			return
		}
		require.ErrorIs(t, err, fencelock.ErrNotAcquired)
		select {
		case <-lease.Done(): // the first's window ended: the second gets it soon after
		case <-time.After(5 * time.Millisecond): // polling the grant: no event to await on another lessor's row
		}
	}
}

// Renewals that are slow on the server but come back inside the trust window keep the lease:
// every renewal takes 1.5 s, longer than the 1 s heartbeat, of a 5.4 s trust window (TTL 6 s,
// margin 0.6 s), so a statement deadline capped at one heartbeat never lets one succeed, and
// the lease is lost when its grant's window ends. The test watches the lease past the end of
// two trust windows in turn: the grant's, and that of the renewal current then; at each, Err
// (which reads the clock itself, whatever the trust watch's timer does) must find the lease
// still held, which only a stalled renewal that came back can have done. The 3.9 s left of
// each window after a renewal's stall is room for a loaded machine's lateness, not a bound the
// behaviour is judged by. (A statement deadline capped at one heartbeat lost this lease at its
// first window's end; found by review.)
func TestSlowRenewalsKeepLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	stallRenewals(t, b, "holder1", 2, 1_000_000, 1.5)
	l1 := newLessor(t, poolWithApp(t, b.DB.URL, "holder1"), "h1", fencelock.WithHeartbeatInterval(time.Second))
	lease, err := l1.TryAcquire(b.Ctx, "x", 6*time.Second)
	require.NoError(t, err)
	for i := range 2 {
		end := lease.TrustedUntil()
		select {
		case <-lease.Done():
		case <-time.After(time.Until(end) + 10*time.Millisecond):
		}
		require.NoError(t, lease.Err(), "lease lost with renewals taking 1.5 s of a 5.4 s trust window (window %d)", i)
		require.True(t, lease.TrustedUntil().After(end), "window %d ended and no renewal moved it on", i)
	}
	var stalled int64
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT last_value FROM public.stall_seq`).Scan(&stalled))
	require.GreaterOrEqual(t, stalled, int64(3), "the renewals were stalled")
	require.NoError(t, lease.Release(b.Ctx))
}

// RunLocked and TryRunLocked return an error, and do not panic, when the pool gives them no
// connection (a cancelled ctx, an unreachable server). (Found by review.)
func TestRunLockedWithoutConnection(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fn := func(context.Context, pgx.Tx, fencelock.Token) error { return nil }
	cancelled, cancel := context.WithCancel(b.Ctx)
	cancel()
	require.ErrorIs(t, newLessor(t, b.Pool, "h").TryRunLocked(cancelled, "x", fn), context.Canceled)
	cfg, err := pgxpool.ParseConfig("postgres://postgres@127.0.0.1:1/x?connect_timeout=1")
	require.NoError(t, err)
	dead, err := pgxpool.NewWithConfig(b.Ctx, cfg)
	require.NoError(t, err)
	defer dead.Close()
	require.Error(t, newLessor(t, dead, "h").TryRunLocked(b.Ctx, "x", fn))
	ctx, cancel2 := context.WithTimeout(b.Ctx, 2*time.Second)
	defer cancel2()
	require.Error(t, newLessor(t, dead, "h").RunLocked(ctx, "x", fn))
}

func itoa(n int) string     { return strconv.Itoa(n) }
func ftoa(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }
