package fencelock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock/internal/db"
)

// MaxLeaseSet is the most names one [Lessor.TryAcquireAll] or [Lessor.AcquireAll] takes.
const MaxLeaseSet = 64

// LeaseSet is a set of leases granted together, all or nothing, by [Lessor.TryAcquireAll] or
// [Lessor.AcquireAll]. Each member is an ordinary [*Lease] with a fencing token of its own
// (larger than every earlier token of its name), renewed by the lessor's heartbeat; fence a
// write to a member's resource with that member's [Lease.FenceTx]. The set ends when its first
// member ends: Done closes and Err says why; release the rest with [LeaseSet.Release]. Safe for
// concurrent use.
type LeaseSet struct {
	leases []*Lease // by name, in byte order
	ending grantEnd
}

func newLeaseSet(leases []*Lease) *LeaseSet {
	s := &LeaseSet{leases: leases, ending: newGrantEnd()}
	for _, lease := range leases {
		lease.ending.afterFunc(func() { s.ending.finish(lease.ending.cause()) })
	}
	return s
}

// Leases returns the members, sorted by name in byte order. The slice is the caller's.
func (s *LeaseSet) Leases() []*Lease { return slices.Clone(s.leases) }

// Lease returns the member named name, or nil.
func (s *LeaseSet) Lease(name string) *Lease {
	i, ok := slices.BinarySearchFunc(s.leases, name, func(l *Lease, n string) int { return strings.Compare(l.name, n) })
	if !ok {
		return nil
	}
	return s.leases[i]
}

// Tokens returns each member's fencing token by name.
func (s *LeaseSet) Tokens() map[string]Token {
	m := make(map[string]Token, len(s.leases))
	for _, l := range s.leases {
		m[l.name] = l.token
	}
	return m
}

// Done returns a channel that is closed when the first member ends (released, lost on the
// server, or past its trust window). It never reopens.
func (s *LeaseSet) Done() <-chan struct{} { return s.ending.done }

// Err returns nil while every member is held and trusted, else the first member's end: as
// [Lease.Err] (it reads the clock, so a set past its trust window ends on the spot).
func (s *LeaseSet) Err() error {
	for _, l := range s.leases {
		_ = l.Err()
	}
	return s.ending.cause()
}

// GuardTx runs [Lease.GuardTx] for every member inside tx, in name order: one statement a
// member. Errors: the first member's error, as for [Lease.GuardTx].
func (s *LeaseSet) GuardTx(ctx context.Context, tx pgx.Tx) error {
	if tx == nil {
		return argError("tx", "must not be nil")
	}
	return s.guardTx(ctx, tx)
}

// guardTx is GuardTx on tx, a pgx.Tx or an adapted *sql.Tx (not nil).
func (s *LeaseSet) guardTx(ctx context.Context, tx db.DBTX) error {
	for _, l := range s.leases {
		if err := l.guardTx(ctx, tx); err != nil {
			return err
		}
	}
	return nil
}

// Release releases every member ([Lease.Release], one statement each, in name order; a member
// someone waits for is handed to the head of its queue). Like [Lease.Release] it runs even
// when ctx has ended: it keeps ctx's values but not its cancellation or deadline, and is
// bounded by 5 s of its own for the whole set; a member whose release the bound cuts short
// expires within its TTL. Errors: the members' errors, joined; a member that had already
// expired or been taken over reports [ErrNotHeld].
func (s *LeaseSet) Release(ctx context.Context) error {
	rctx, stop := detached(ctx, cleanupTimeout)
	defer stop()
	var errs []error
	for _, l := range s.leases {
		if err := l.release(rctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// TryAcquireAll grants every lease of names to this lessor for ttl, all or nothing, in one
// statement: either every member was free (expired or never taken, nobody waiting for it) and
// is now held with a new token of its own, or nothing changed. names holds 1 to [MaxLeaseSet]
// distinct lease names, each as for [Lessor.TryAcquire]; ttl too.
//
// The statement takes the members' rows in one global order (byte order of the names), and
// never waits for a row another transaction locks (a renewal in flight, another grant of the
// name, a transaction-scoped holder): that refuses the set. So two sets that overlap never
// deadlock, whichever order their callers list them in, and no member is ever held without
// the others (migrations/00010_multi_locks.sql). Like TryAcquire it does not barge: a member
// that anyone waits for refuses the set.
//
// Errors: [ErrNotAcquired] if any member is held by someone else or waited for; an error
// wrapping [ErrAlreadyHeld] if this lessor holds one of them; an [*ArgumentError] before any
// SQL (no names, too many, a duplicate, a bad name or TTL); otherwise as for
// [Lessor.TryAcquire]. If ctx ends while the grant is in flight, whatever it may have granted
// is ended before TryAcquireAll returns.
func (l *Lessor) TryAcquireAll(ctx context.Context, names []string, ttl time.Duration) (*LeaseSet, error) {
	sorted, lt, err := l.checkSet(names, ttl)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	set, _, err := l.tryAll(ctx, sorted, lt)
	err = notAcquired(err)
	m := l.cfg.common.metrics
	m.acquired(ctx, mTryAcquireAll, start, err)
	if err == ErrNotAcquired {
		m.contention(mTryAcquireAll)
	}
	return set, err
}

// AcquireAll is [Lessor.TryAcquireAll] that tries again while the set is refused, until it is
// granted or ctx ends: after the lessor's [Backoff], or just after the first held member
// expires if that is sooner. A set waits in no queue: it is granted at an attempt that finds
// every member free and nobody waiting for any, so under steady contention for one of its
// members (waiters that queue for it one after another) it can wait long; give ctx a
// deadline.
//
// Errors: ctx's error (wrapped) when ctx ends first, with nothing held; otherwise as for
// [Lessor.TryAcquireAll], except that [ErrNotAcquired] is never returned.
func (l *Lessor) AcquireAll(ctx context.Context, names []string, ttl time.Duration) (set *LeaseSet, err error) {
	sorted, lt, err := l.checkSet(names, ttl)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	defer func() { l.cfg.common.metrics.acquired(ctx, mAcquireAll, start, err) }()
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	for n := 0; ; n++ {
		set, remaining, err := l.tryAll(ctx, sorted, lt)
		if !errors.Is(err, errRefused) {
			return set, err
		}
		if n == 0 {
			l.cfg.common.metrics.contention(mAcquireAll)
		}
		d := l.cfg.backoff(n)
		if remaining > 0 && remaining < d {
			d = remaining + l.cfg.backoff(0)/4
		}
		if t == nil {
			t = time.NewTimer(d)
		} else {
			t.Reset(d)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("acquire leases %q: %w", sorted, context.Cause(ctx))
		case <-t.C:
		}
	}
}

// checkSet validates a set's names and TTL, and returns the names sorted in byte order.
func (l *Lessor) checkSet(names []string, ttl time.Duration) ([]string, leaseTimes, error) {
	if len(names) == 0 || len(names) > MaxLeaseSet {
		return nil, leaseTimes{}, argError("names", "has %d names; it must have 1 to %d", len(names), MaxLeaseSet)
	}
	for i, name := range names {
		if err := validateName(fmt.Sprintf("names[%d]", i), name); err != nil {
			return nil, leaseTimes{}, err
		}
	}
	sorted := slices.Clone(names)
	slices.Sort(sorted)
	for i := 1; i < len(sorted); i++ {
		if sorted[i] == sorted[i-1] {
			return nil, leaseTimes{}, argError("names", "lists %q twice", sorted[i])
		}
	}
	lt, err := l.cfg.times(ttl)
	return sorted, lt, err
}

// tryAll is one attempt at the set sorted: the set, or errRefused with the time until its
// first held member expires (0: unknown), or another error. It takes the members' gates in
// name order (so two sets of this lessor never wait for each other in a cycle), and checks
// inside them that this lessor holds none.
func (l *Lessor) tryAll(ctx context.Context, sorted []string, lt leaseTimes) (*LeaseSet, time.Duration, error) {
	var exits []func()
	defer func() {
		for _, exit := range exits {
			exit()
		}
	}()
	for _, name := range sorted {
		exit, err := l.enterFree(ctx, name)
		if err != nil {
			return nil, 0, err
		}
		exits = append(exits, exit)
	}
	var rows []db.LeaseGrantAllRow
	what := fmt.Sprintf("acquire leases %q", sorted)
	sent, err := l.runGrant(ctx, what, func(conn *pgxpool.Conn) (err error) {
		rows, err = l.q.LeaseGrantAll(ctx, conn, db.LeaseGrantAllParams{Names: sorted, Holder: l.cfg.holder, TtlUs: lt.TTL.Microseconds()})
		return err
	}, l.endUnknownGrants(sorted)) // its gates are held: no other attempt of this lessor on these names runs
	if err != nil {
		return nil, 0, err
	}
	if len(rows) == 0 || rows[0].Token == 0 {
		var remaining time.Duration
		if len(rows) > 0 {
			remaining = time.Duration(rows[0].RemainingUs) * time.Microsecond
		}
		return nil, remaining, errRefused
	}
	if len(rows) != len(sorted) { // cannot happen (grant_all grants all or none): end what came back
		for _, row := range rows {
			l.releaseToken(ctx, row.Name, Token(row.Token))
		}
		return nil, 0, fmt.Errorf("%s: the statement granted %d leases of %d", what, len(rows), len(sorted))
	}
	leases := make([]*Lease, len(rows))
	for i, row := range rows {
		leases[i] = newLease(l, row.Name, Token(row.Token), lt, sent, row.ExpiresAt)
	}
	slices.SortFunc(leases, func(a, b *Lease) int { return strings.Compare(a.name, b.name) })
	if !l.cfg.clock.Now().Before(leases[0].TrustedUntil()) {
		// The reply came after the trust window (the same for every member): useless.
		for _, lease := range leases {
			lease.end(ErrReleased)
			l.releaseToken(ctx, lease.name, lease.token)
		}
		return nil, 0, &lateGrant{what: fmt.Sprintf("the set of %d leases", len(leases)), ttl: lt.TTL}
	}
	for _, lease := range leases {
		l.add(lease)
	}
	return newLeaseSet(leases), 0, nil
}
