package fencelock_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
)

// A set is granted whole, each member with a token larger than its name's earlier ones; one
// held member refuses the set and leaves every other member as it was.
func TestMultiLockAllOrNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := newLessor(t, b.Pool, "ml-a")
	c := newLessor(t, b.Pool, "ml-c")
	old, err := a.TryAcquire(b.Ctx, "ml:2", 10*time.Second)
	require.NoError(t, err)
	_, err = c.TryAcquireAll(b.Ctx, []string{"ml:3", "ml:1", "ml:2"}, 10*time.Second)
	require.ErrorIs(t, err, fencelock.ErrNotAcquired)
	var n int
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM fencelock.leases WHERE holder = 'ml-c' AND expires_at > clock_timestamp()`).Scan(&n))
	require.Zero(t, n, "a refused set holds no member")
	require.NoError(t, old.Release(b.Ctx))

	set, err := c.TryAcquireAll(b.Ctx, []string{"ml:3", "ml:1", "ml:2"}, 10*time.Second)
	require.NoError(t, err)
	names := []string{}
	for _, l := range set.Leases() {
		names = append(names, l.Name())
		require.NoError(t, l.Err())
		require.Equal(t, "ml-c", readLease(t, b.Ctx, b.Pool, l.Name()).Holder)
	}
	require.Equal(t, []string{"ml:1", "ml:2", "ml:3"}, names)
	require.Greater(t, set.Lease("ml:2").Token(), old.Token())
	require.Len(t, set.Tokens(), 3)
	require.Nil(t, set.Lease("ml:4"))
	require.NoError(t, set.Err())

	// Overlapping sets: refused while held, by anyone, this lessor included.
	_, err = a.TryAcquireAll(b.Ctx, []string{"ml:3", "ml:4"}, time.Second)
	require.ErrorIs(t, err, fencelock.ErrNotAcquired)
	_, err = c.TryAcquireAll(b.Ctx, []string{"ml:3", "ml:4"}, time.Second)
	require.ErrorIs(t, err, fencelock.ErrAlreadyHeld)
	_, err = a.TryAcquire(b.Ctx, "ml:4", time.Second)
	require.NoError(t, err, "the refused sets left ml:4 free")

	// GuardTx guards every member in the caller's transaction.
	require.NoError(t, pgx.BeginFunc(b.Ctx, b.Pool, func(tx pgx.Tx) error { return set.GuardTx(b.Ctx, tx) }))

	// Losing one member ends the set.
	require.NoError(t, set.Lease("ml:1").Release(b.Ctx))
	err = pgx.BeginFunc(b.Ctx, b.Pool, func(tx pgx.Tx) error { return set.GuardTx(b.Ctx, tx) })
	require.ErrorIs(t, err, fencelock.ErrReleased, "a guard of a set with a member released")
	select {
	case <-set.Done():
	default:
		t.Fatal("the set's Done is open after a member ended")
	}
	require.ErrorIs(t, set.Err(), fencelock.ErrReleased)
	require.ErrorIs(t, set.Release(b.Ctx), fencelock.ErrNotHeld, "ml:1 was released already")
	for _, name := range []string{"ml:1", "ml:2", "ml:3"} {
		require.True(t, readLease(t, b.Ctx, b.Pool, name).Expired, name)
	}
}

// Bad input is refused before any SQL.
func TestMultiLockBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := newLessor(t, b.Pool, "ml-bad")
	many := make([]string, fencelock.MaxLeaseSet+1)
	for i := range many {
		many[i] = fmt.Sprint("n", i)
	}
	for _, names := range [][]string{nil, {}, {"a", "a"}, {"a", ""}, {"a\x00"}, many} {
		_, err := l.TryAcquireAll(b.Ctx, names, time.Second)
		require.ErrorIs(t, err, fencelock.ErrInvalidArgument, "%q", names)
		_, err = l.AcquireAll(b.Ctx, names, time.Second)
		require.ErrorIs(t, err, fencelock.ErrInvalidArgument, "%q", names)
	}
	_, err := l.TryAcquireAll(b.Ctx, []string{"a"}, 0)
	require.ErrorIs(t, err, fencelock.ErrInvalidArgument)
	var n int
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM fencelock.leases`).Scan(&n))
	require.Zero(t, n, "no SQL ran")
}

// 32 goroutines over random overlapping sets of 1-5 names out of 10, each listing its names in
// a random order: no deadlock (every acquire started returns a grant, none fails, within the
// bundle's two minutes), no partial hold (every grant of a name went to a set that got all of its
// names in the same transaction), and each name's tokens rise with every grant.
func TestMultiLockContention(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.Pool.Exec(b.Ctx, `
		CREATE TABLE ml_log (id bigserial PRIMARY KEY, name text, holder text, token bigint, xid xid8);
		CREATE FUNCTION ml_log() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.token <> 0 AND (TG_OP = 'INSERT' OR NEW.token <> OLD.token) THEN
				INSERT INTO public.ml_log (name, holder, token, xid) VALUES (NEW.name, NEW.holder, NEW.token, pg_current_xact_id());
			END IF;
			RETURN NULL;
		END $$;
		CREATE TRIGGER ml_log AFTER INSERT OR UPDATE ON fencelock.leases FOR EACH ROW EXECUTE FUNCTION ml_log();`)
	require.NoError(t, err)
	names := make([]string, 10)
	for i := range names {
		names[i] = fmt.Sprintf("mlc:%d", i)
	}
	// Each worker takes up to perWorker sets and starts none after startFor (beside a second
	// suite, 480 sets took over a minute); an acquire it started must still be granted, within
	// a context of the test's own that ends 90 s after the last start, far above any wait for
	// a set. The checks afterwards have a context of their own.
	const startFor = 40 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), startFor+90*time.Second)
	defer cancel()
	startEnd := time.Now().Add(startFor)
	var started atomic.Int64
	type grant struct {
		holder string
		tokens map[string]fencelock.Token
	}
	var mu sync.Mutex
	var grants []grant
	var wg sync.WaitGroup
	const perWorker = 15
	for w := range 32 {
		holder := fmt.Sprintf("mlc-%d", w)
		l := newLessor(t, b.Pool, holder, fastBackoff)
		rng := rand.New(rand.NewPCG(uint64(w), 7))
		wg.Go(func() {
			for range perWorker {
				if time.Now().After(startEnd) {
					return
				}
				started.Add(1)
				perm := rng.Perm(len(names))[:1+rng.IntN(5)]
				set := make([]string, len(perm))
				for i, p := range perm {
					set[i] = names[p]
				}
				s, err := l.AcquireAll(ctx, set, 5*time.Second)
				if err != nil {
					t.Errorf("%s: %v", holder, err)
					return
				}
				mu.Lock()
				grants = append(grants, grant{holder, s.Tokens()})
				mu.Unlock()
				time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond)
				if err := s.Release(ctx); err != nil {
					t.Errorf("%s: release: %v", holder, err)
					return
				}
			}
		})
	}
	wg.Wait()
	require.False(t, t.Failed())
	require.Len(t, grants, int(started.Load()), "every acquire started was granted")
	t.Logf("%d sets granted of %d (%d workers x %d, none started after %v)", len(grants), 32*perWorker, 32, perWorker, startFor)

	// The log: grants of a name by transaction.
	checkCtx, cancelCheck := context.WithTimeout(context.Background(), time.Minute)
	defer cancelCheck()
	rows, err := b.Pool.Query(checkCtx, `SELECT name, holder, token, xid::text FROM ml_log ORDER BY id`)
	require.NoError(t, err)
	byXid := map[string]map[string]int64{}
	holderOf := map[string]string{}
	last := map[string]int64{}
	logged := 0
	for rows.Next() {
		var name, holder, xid string
		var token int64
		require.NoError(t, rows.Scan(&name, &holder, &token, &xid))
		require.Greater(t, token, last[name], "tokens of %s rise with every grant", name)
		last[name] = token
		if byXid[xid] == nil {
			byXid[xid] = map[string]int64{}
		}
		byXid[xid][name] = token
		holderOf[xid] = holder
		logged++
	}
	require.NoError(t, rows.Err())
	require.Equal(t, logged, func() int {
		n := 0
		for _, g := range grants {
			n += len(g.tokens)
		}
		return n
	}(), "every grant logged belongs to a set that was granted")
	// Each transaction granted exactly one whole set that its caller got.
	want := map[string]bool{}
	for _, g := range grants {
		keys := make([]string, 0, len(g.tokens))
		for n, tok := range g.tokens {
			keys = append(keys, fmt.Sprintf("%s=%d", n, tok))
		}
		slices.Sort(keys)
		want[g.holder+" "+fmt.Sprint(keys)] = true
	}
	for xid, m := range byXid {
		keys := make([]string, 0, len(m))
		for n, tok := range m {
			keys = append(keys, fmt.Sprintf("%s=%d", n, tok))
		}
		slices.Sort(keys)
		require.True(t, want[holderOf[xid]+" "+fmt.Sprint(keys)], "transaction %s granted %v to %s, which is no set a caller got", xid, keys, holderOf[xid])
	}
	require.Len(t, byXid, len(grants))
}

// A ctx that ends while the set's grant statement is in flight (here waiting on a row another
// transaction is inserting), with the cancel request lost, leaves nothing held: the statement goes on once that transaction
// commits and grants the set to nobody, and the cleanup ends every member after the backend
// has exited.
func TestMultiLockCancelledMidGrantLeavesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool, refuseNextDial := poolRefusingCancel(t, b)
	l := newLessor(t, pool, "ml-mid")
	defer holdFor(t, b, 300*time.Millisecond, `INSERT INTO fencelock.leases (name, holder, token, acquired_at, expires_at) VALUES ('mlm:2', 'x', 0, now(), now())`)()
	ctx, cancel := context.WithTimeout(b.Ctx, 100*time.Millisecond)
	defer cancel()
	refuseNextDial()
	_, err := l.TryAcquireAll(ctx, []string{"mlm:1", "mlm:2"}, 10*time.Second)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	var held, ended int
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*) FILTER (WHERE expires_at > clock_timestamp()), count(*) FILTER (WHERE expires_at <= clock_timestamp() AND token > 0)
		FROM fencelock.leases WHERE holder = 'ml-mid'`).Scan(&held, &ended))
	require.Zero(t, held, "a member granted after the caller gave up is still held")
	require.Equal(t, 2, ended, "the statement went on and granted the set, which the cleanup ended")
	set, err := newLessor(t, b.Pool, "ml-mid2").TryAcquireAll(b.Ctx, []string{"mlm:1", "mlm:2"}, time.Second)
	require.NoError(t, err)
	require.NoError(t, set.Release(b.Ctx))
}
