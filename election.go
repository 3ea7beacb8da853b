package fencelock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencelock/fencelock/internal/db"
)

// ErrNoLeader is returned by [Election.Leader] while nobody leads the election.
var ErrNoLeader = errors.New("fencelock: no leader")

// MaxLeaderValue is the longest value a leader may proclaim, in bytes.
const MaxLeaderValue = 4096

// Election is leader election on a named term, on a [Lessor]'s leases: a term is a grant of
// the lease name, its fencing token the term's, so the leader's writes are fenced as any
// holder's ([Term.FenceTx]). Candidates wait in the name's queue, first come, first served; a
// resign hands the term to the next candidate in the release's own statement; a leader that
// dies is replaced once its term's TTL has run out on the database clock. The leader proclaims a
// value (its address, say) that everyone may read ([Election.Leader]) and observe
// ([Election.Observe]); SQL reads it from the view fencelock.leaders.
//
// An Election is safe for concurrent use. Its candidates are the lessors that campaign on its
// name; one lessor holds one term at a time (a lessor is not re-entrant).
//
// The shape is etcd's concurrency.Election (Campaign, Proclaim, Resign, Leader, Observe), with
// the term's fencing token checked in the same transaction as the leader's writes, which
// neither etcd's recipe nor client-go's leader election gives.
type Election struct {
	lessor *Lessor
	name   string
	ttl    time.Duration
}

// NewElection returns the election name on l, whose terms are leases of ttl: the longest a dead
// leader keeps the others out. name is 1 to [MaxNameLength] bytes of UTF-8 without NUL. It is
// the name of the term's lease, in the one namespace of leases: a plain lease or a [Job] of the
// same name would exclude the election's candidates and read as its leader; keep the names
// apart (a prefix such as "election/"). ttl is a time.Duration as for
// [Lessor.Acquire], suited to l's heartbeat and safety margin. Errors: an [*ArgumentError]
// for a nil lessor or a bad name or ttl. No SQL runs.
func NewElection(l *Lessor, name string, ttl time.Duration) (*Election, error) {
	if l == nil {
		return nil, argError("lessor", "must not be nil")
	}
	if err := validateName("name", name); err != nil {
		return nil, err
	}
	if _, err := l.cfg.times(ttl); err != nil {
		return nil, err
	}
	return &Election{lessor: l, name: name, ttl: ttl}, nil
}

// Name returns the election's name.
func (e *Election) Name() string { return e.name }

// Campaign waits until this lessor is elected (its grant of the election's lease, in the
// name's queue) or ctx ends, then proclaims value and returns the term. value is valid UTF-8
// without NUL, at most [MaxLeaderValue] bytes.
//
// Errors: an [*ArgumentError] for a bad value (no SQL runs); as for [Lessor.Acquire]
// (ctx's error, wrapped, when ctx ends first, with nothing held); a [*LeaseLostError] when the
// term was lost before its value could be proclaimed, or ctx's error, wrapped, when ctx ended
// just after the grant: the term is then released (as by [Lease.Release], whatever ctx).
func (e *Election) Campaign(ctx context.Context, value string) (*Term, error) {
	if err := validateLeaderValue(value); err != nil {
		return nil, err
	}
	lease, err := e.lessor.Acquire(ctx, e.name, e.ttl)
	if err != nil {
		return nil, err
	}
	t := &Term{election: e, lease: lease}
	if err := t.Proclaim(ctx, value); err != nil {
		_ = lease.Release(ctx) // detached from ctx, which may be why Proclaim failed
		return nil, fmt.Errorf("campaign %q: %w", e.name, err)
	}
	return t, nil
}

// Observe returns a channel that receives the election's state: the current one first, then
// each change: a new term, a value proclaimed, and the zero LeaderInfo when nobody leads (a
// term resigned or lapsed, and its successor, if any, not yet granted: a crashed leader's heir
// is granted just after the old term's expiry, which the observer reads first). It is closed
// when ctx ends, and not before; its goroutine and its subscription end with it.
//
// Changes wake the observer, not a poll: every Campaign, Proclaim and Resign NOTIFYs the
// election's observers, which subscribe to the listening connection of the lessor's pool
// (shared with the pool's waiters: internal/notify), and a term that lapses is noticed at its
// expiry, read from the database. It also reads at least once per TTL, for the ends that
// notify nobody (a term's lease released by other means than Resign, a renewal that committed
// just after the read at its expiry). Where LISTEN cannot be trusted (behind a pooler that
// shares sessions) or while the listening connection is down, the observer reads the leader
// every min(250 ms, TTL/4) instead, and again as soon as LISTEN is back; while reads fail it
// tries again with a backoff.
//
// The observer reads on a session of its own, watched as the pool's listening connection is:
// after 2 s without an answer (a read's or a probe's) it is probed with an empty statement,
// and a read or probe not answered within 2 s closes it (the next read opens another, waiting
// at most 5 s for it). So a listening connection or reading session that dies silently (a
// half-open TCP flow: a NAT or firewall that dropped it, a vanished peer) is noticed within
// 4 s of its last answer, whatever the TTL, and a change made meanwhile reaches the channel
// within those 4 s plus a hand-off: a new session and a read (milliseconds on a healthy
// network). The probe costs an idle observer one empty statement per 2 s.
//
// States reach the channel in the order they happened, terms rising; one that lasted less
// than a read is not delivered when the next replaced it before the read. A receiver that does
// not keep up holds the observer back, not the pool's listening connection: a notification
// that comes meanwhile makes the observer read again once, when the receiver takes the state.
//
// Safe for concurrent use; each call has its own channel.
func (e *Election) Observe(ctx context.Context) <-chan LeaderInfo {
	ch := make(chan LeaderInfo)
	go observeLeader(ctx, e.lessor, e.name, e.ttl, ch)
	return ch
}

// Leader returns the current leader. Errors: [ErrNoLeader] while nobody leads; otherwise the
// pgx error, wrapped. One statement; safe for concurrent use.
func (e *Election) Leader(ctx context.Context) (LeaderInfo, error) {
	row, err := e.lessor.q.ElectionLeader(ctx, e.lessor.pool, e.name)
	if errors.Is(err, pgx.ErrNoRows) {
		return LeaderInfo{}, ErrNoLeader
	}
	if err != nil {
		return LeaderInfo{}, wrapPg(fmt.Sprintf("leader of %q", e.name), err)
	}
	return leaderInfoOf(row), nil
}

// Term is one leader's term of an [Election]: a lease of the election's name, renewed by the
// lessor's heartbeat. The leader must stop acting as leader when [Term.Done] closes; its
// fenced writes ([Term.FenceTx], or [FenceTx] with [Term.Token]) are rejected once a later term
// has written. Safe for concurrent use.
type Term struct {
	election *Election
	lease    *Lease
}

// Token returns the term's fencing token, an int64 > 0, larger than every earlier term's.
func (t *Term) Token() Token { return t.lease.Token() }

// Lease returns the lease that holds the term.
func (t *Term) Lease() *Lease { return t.lease }

// Done closes when the term ends: its trust window ended without a renewal, a renewal found it
// gone, or it was resigned. Err says which ([Lease.Err]).
func (t *Term) Done() <-chan struct{} { return t.lease.Done() }

// Err is the term's [Lease.Err]: nil while it is held and trusted.
func (t *Term) Err() error { return t.lease.Err() }

// Context is the term's [Lease.Context]: cancelled, with the term's error as cause, when the
// term ends, at the end of its trust window at the latest.
func (t *Term) Context(parent context.Context) (context.Context, context.CancelFunc) {
	return t.lease.Context(parent)
}

// FenceTx is [Lease.FenceTx] for the term: inside tx, it checks that the term is still the
// current one and advances resource's high-water mark to its token.
func (t *Term) FenceTx(ctx context.Context, tx pgx.Tx, resource string) error {
	return t.lease.FenceTx(ctx, tx, resource)
}

// Proclaim sets the value the leader announces (valid UTF-8 without NUL, at most
// [MaxLeaderValue] bytes) and wakes the election's observers. Errors: an [*ArgumentError] for a
// bad value (no SQL runs); Err()
// when the term has ended; a [*LeaseLostError] when the term is no longer the current grant on
// the database (Done then closes); otherwise the pgx error, wrapped.
func (t *Term) Proclaim(ctx context.Context, value string) error {
	if err := validateLeaderValue(value); err != nil {
		return err
	}
	if err := t.lease.Err(); err != nil {
		return err
	}
	ok, err := t.election.lessor.q.ElectionProclaim(ctx, t.election.lessor.pool, db.ElectionProclaimParams{
		Name: t.election.name, Holder: t.election.lessor.cfg.holder, Token: int64(t.lease.token), Value: value,
	})
	if err != nil {
		return wrapPg(fmt.Sprintf("proclaim in %q", t.election.name), err)
	}
	if !ok {
		t.lease.lost(errGoneOnServer)
		return t.lease.Err()
	}
	return nil
}

// Resign ends the term: the release hands it to the next candidate in its own statement (a new
// leader in about a millisecond when one waits), and the election's observers are woken. Two
// statements. Like [Lease.Release] it runs even when ctx has ended: it keeps ctx's values but
// not its cancellation or deadline, and is bounded by 5 s of its own for both statements.
// Errors: as for [Lease.Release]: [ErrNotHeld] when the grant had already expired or been taken
// over on the server (a term that ended only by its local trust window is still released).
func (t *Term) Resign(ctx context.Context) error {
	rctx, stop := detached(ctx, cleanupTimeout)
	defer stop()
	err := t.lease.release(rctx)
	if nerr := t.election.lessor.q.ElectionNotify(rctx, t.election.lessor.pool, t.election.name); nerr != nil && err == nil {
		err = wrapPg(fmt.Sprintf("resign %q: wake observers", t.election.name), nerr)
	}
	return err
}

// validateLeaderValue checks a value a leader proclaims: valid UTF-8 without NUL (PostgreSQL's
// text refuses both), at most MaxLeaderValue bytes.
func validateLeaderValue(value string) error { return validateText("value", value, MaxLeaderValue) }
