package fencelock

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/fencelock/fencelock/internal/db"
)

// MaxSemaphoreLimit is the largest limit a [Semaphore] takes. A grant and a release cost the
// same at every limit (free permits are kept in a set); what grows with the limit is the
// reclaim of permits lost by their TTL (one read of every permit row, at most once a second
// while permits are short) and [Semaphore.State] (docs/PERFORMANCE.md).
const MaxSemaphoreLimit = 10_000

// maxSemaphoreName leaves room in a lease name for a permit's "#<slot>" suffix.
const maxSemaphoreName = MaxNameLength - len("#9999")

// Semaphore is a named counting semaphore: at most its limit of holders at once, across every
// process that shares the database. Each holder holds a permit, which is a [*Lease]: a TTL on
// the database clock, renewed by the lessor's heartbeat, Done and Err when it is lost, a
// fencing token of its own (an int64 > 0 larger than every earlier token of its permit), and
// GuardTx, FenceTx and Release as for any lease.
//
// Never more than the limit of permits are unexpired at once on the database clock, whatever
// the faults: permit i is the lease row of slot i < limit, granted only while it is expired, so
// the limit holds by construction; after a lower limit, grants count the permits until those
// above it have ended, one counting attempt at a time (migrations/00012_semaphore_handoff.sql,
// 00015_semaphore_no_lock_waits.sql). A permit whose holder died, paused or lost its connection
// counts until its TTL ends, and its renewal can no longer revive it; it is reclaimed by the
// first grant attempt after it expired, at most about a second later while permits are short.
// The limit is stored in the database (table fencelock.semaphores): the first acquire of a
// semaphore creates it with the limit given to NewSemaphore, and [Semaphore.SetLimit] changes
// it at run time for everyone. A lower limit ends no permit: nothing is granted until the count
// falls below it.
//
// Permit i of semaphore S is the lease named "S#i" (0 <= i < limit): fencelock.holders and
// `fencelock locks` show permits as leases of those names; `fencelock release --force` ends
// one. Do not take a lease of that form with [Lessor.Acquire]: it would not be counted.
//
// Waiters are served first come, first served: a waiting [Semaphore.Acquire] takes a place in
// the semaphore's queue (fencelock.semaphore_waiters), and a try never takes a permit someone
// waits for. A release gives its permit to the head of the queue in its own statement (a new
// grant of that permit, with a fresh token) and tells that waiter alone, by NOTIFY on its
// pool's listening connection; the waiter takes it without a statement of its own. When the
// head's own attempt is running at that instant (refreshing its place, every third of its
// liveness, or looking again after a wake-up), the permit is freed for the head and the head
// alone is told to look again: the waiters behind it are never served first
// (migrations/00016_semaphore_head_first.sql). No grant attempt waits for another's lock: waiters run no statement between
// refreshes, a grant never waits for another grant, and an attempt that cannot decide at once
// (another transaction is creating the semaphore's row, for its first acquires, or counting its
// permits, after a lower limit) changes nothing, and looks again after the lessor's first
// [Backoff] pause (at most 20 ms), instead of queueing in the database behind that transaction.
// A grant attempt still waits for a SetLimit that is running (it holds the semaphore's row
// meanwhile), for a page added to the permits' table, and, when its grant wakes waiters, for
// PostgreSQL's lock on notifying commits (docs/PERFORMANCE.md, issue 30). A permit ended by
// `fencelock release --force` (or the live view's forced release) goes to the head of the queue
// as its holder's release does: given with a fresh token, or freed with the head told to take
// it, and the command says which (migrations/00018_forced_permit_release.sql). A permit lost by
// its TTL goes to the waiters when it is reclaimed: the head of the queue tries again when the
// next reclaim is due. Behind a pooler (PgBouncer in
// transaction mode) waiters poll with the lessor's [Backoff] and find the permit given to them.
// Each Acquire has a place of its own, so one lessor may hold and wait for several permits of a
// semaphore at once.
//
// A Semaphore is safe for concurrent use. The idea is Dijkstra's semaphore with the leased
// permits of Curator's InterProcessSemaphoreV2 and Redisson's RPermitExpirableSemaphore.
type Semaphore struct {
	l     *Lessor
	name  string
	limit int
}

// SemaphoreState is a semaphore's state on the database clock.
type SemaphoreState struct {
	Limit   int   // at most this many unexpired permits
	Held    int64 // permits unexpired now (above Limit only after a limit was lowered)
	Waiting int64 // live waiters in the queue
}

// NewSemaphore returns the semaphore name of lessor l, whose permits are leases of l. name is
// 1 to MaxNameLength-5 bytes of UTF-8 without NUL; limit is 1 to [MaxSemaphoreLimit], used
// when the first acquire creates the semaphore (the limit stored then wins over the one given
// here; [Semaphore.SetLimit] changes it). Errors: an [*ArgumentError]. No SQL runs.
func NewSemaphore(l *Lessor, name string, limit int) (*Semaphore, error) {
	if l == nil {
		return nil, argError("lessor", "must not be nil")
	}
	if err := validateName("name", name); err != nil {
		return nil, err
	}
	if len(name) > maxSemaphoreName {
		return nil, argError("name", "is %d bytes long; a semaphore's limit is %d (room for a permit's suffix)", len(name), maxSemaphoreName)
	}
	if err := validateLimit(limit); err != nil {
		return nil, err
	}
	return &Semaphore{l: l, name: name, limit: limit}, nil
}

func validateLimit(limit int) error {
	if limit < 1 || limit > MaxSemaphoreLimit {
		return argError("limit", "is %d; it must be between 1 and %d", limit, MaxSemaphoreLimit)
	}
	return nil
}

// Name returns the semaphore's name.
func (s *Semaphore) Name() string { return s.name }

// SetLimit sets the semaphore's limit to limit (1 to [MaxSemaphoreLimit]) for every process,
// in one statement, and wakes the waiters a larger limit lets in. A lower limit ends no
// permit: nothing is granted until fewer than limit are held. It returns the previous limit (0
// when the semaphore had no row yet). Errors: an [*ArgumentError] before any SQL; otherwise the
// pgx error, wrapped.
func (s *Semaphore) SetLimit(ctx context.Context, limit int) (previous int, err error) {
	if err := validateLimit(limit); err != nil {
		return 0, err
	}
	prev, err := s.l.q.SemaphoreSetLimit(ctx, s.l.pool, db.SemaphoreSetLimitParams{Sem: s.name, PermitLimit: int32(limit)})
	if err != nil {
		return 0, wrapPg(fmt.Sprintf("set the limit of semaphore %q", s.name), err)
	}
	return int(prev), nil
}

// State reads the semaphore's limit, permits held and live waiters, in one statement. A
// semaphore nobody has acquired yet reports the limit given to NewSemaphore and nothing held.
// Errors: the pgx error, wrapped.
func (s *Semaphore) State(ctx context.Context) (SemaphoreState, error) {
	row, err := s.l.q.SemaphoreState(ctx, s.l.pool, s.name)
	if errors.Is(err, pgx.ErrNoRows) {
		return SemaphoreState{Limit: s.limit}, nil
	}
	if err != nil {
		return SemaphoreState{}, wrapPg(fmt.Sprintf("read semaphore %q", s.name), err)
	}
	return SemaphoreState{Limit: int(row.PermitLimit), Held: row.Held, Waiting: row.Waiting}, nil
}
