package fencelock

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock/internal/db"
)

// A lease granted only if it is free: Lessor.TryAcquire, one statement.

// TryAcquire grants the lease name for ttl to this lessor if nobody holds it, in one
// statement. name is 1 to [MaxNameLength] bytes of UTF-8 without NUL; ttl is a time.Duration
// between [MinTTL] and [MaxTTL], measured on the database clock (Postgres rounds it to
// microseconds). The lease is renewed by the heartbeat until released or lost.
//
// It does not barge: while anyone waits in the name's queue (a waiting Acquire or RunLocked of
// any lessor), it is refused even if the lease is free at that moment, so a caller that
// retries TryAcquire in a loop cannot starve the queue (before the queue, one such caller
// took most grants; docs/PERFORMANCE.md). A try that must get in line uses [Lessor.Acquire]
// with a deadline instead.
//
// Errors: [ErrNotAcquired] if another holder has it or anyone waits for it; an error that is
// [ErrNotAcquired] for errors.Is and says so if the grant's reply came back after its trust
// window had ended (the grant is then released again); an error wrapping
// [ErrAlreadyHeld] if this lessor holds it already (a lessor is not re-entrant); an
// [*ArgumentError] before any SQL; an error wrapping [ErrReadOnly] on a hot standby; an
// error wrapping [ErrTokenSequence] for a misconfigured token sequence, [ErrTokenBudget]
// when the token budget is spent or [ErrTokenEpochBehind] when the epoch went back;
// otherwise the pgx error, wrapped. If ctx ends while the grant is in flight, the grant may
// have happened on the server: TryAcquire then ends it (scoped to this holder) before it
// returns, so nothing is left held.
func (l *Lessor) TryAcquire(ctx context.Context, name string, ttl time.Duration) (*Lease, error) {
	if err := validateName("name", name); err != nil {
		return nil, err
	}
	lt, err := l.cfg.times(ttl)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	lease, err := l.tryAcquire(ctx, name, lt)
	err = notAcquired(err)
	m := l.cfg.common.metrics
	m.acquired(ctx, mTryAcquire, start, err)
	if err == ErrNotAcquired {
		m.contention(mTryAcquire)
	}
	return lease, err
}

// tryAcquire is TryAcquire's one attempt: LeaseGrant, the one statement of an uncontended
// grant, which refuses while anyone waits in the name's queue. It returns the lease,
// errRefused, or another error.
func (l *Lessor) tryAcquire(ctx context.Context, name string, lt leaseTimes) (*Lease, error) {
	exit, err := l.enterFree(ctx, name)
	if err != nil {
		return nil, err
	}
	defer exit()
	var row db.LeaseGrantRow
	sent, err := l.grantStatement(ctx, name, func(conn *pgxpool.Conn) (err error) {
		row, err = l.q.LeaseGrant(ctx, conn, db.LeaseGrantParams{Name: name, Holder: l.cfg.holder, TtlUs: lt.TTL.Microseconds(), Nowait: true, MayInsert: true})
		return err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		// Held and unexpired, waited for, or the row is held by a transaction.
		return nil, errRefused
	}
	if err != nil {
		return nil, err
	}
	return l.granted(ctx, name, lt, Token(row.Token), sent, row.ExpiresAt)
}
