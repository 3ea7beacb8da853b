package fencelock

import (
	"errors"
	"fmt"
	"time"

	"github.com/fencelock/fencelock/internal/pgerr"
	"github.com/fencelock/fencelock/internal/validate"
)

// Sentinel errors. Each names a state; the typed errors below carry detail and match them
// under [errors.Is]. Postgres and network errors are wrapped with %w, so [pgconn.PgError] and
// context errors stay reachable through [errors.As] and [errors.Is].
var (
	// ErrInvalidArgument matches every [*ArgumentError]: bad input refused before any SQL ran.
	// It is the same value as package ratelimit's ErrInvalidArgument.
	ErrInvalidArgument = validate.ErrInvalidArgument

	// ErrNotAcquired is returned by the try variants when another holder has the lease (or
	// holds its row in a transaction) right now. An error that matches it with errors.Is,
	// with a message of its own, says why otherwise: a grant whose reply came after its trust
	// window, released at once; a semaphore's reason for refusing a permit.
	ErrNotAcquired = errors.New("fencelock: not acquired: held by another holder")

	// ErrNotHeld is returned by Lease.Release and AdvisoryLock.Unlock when the grant was no
	// longer held: a lease's TTL ran out or a newer grant took the name over (nothing was
	// changed), or an advisory lock had already ended. (Renew reports a lost lease with a
	// *LeaseLostError instead.)
	ErrNotHeld = errors.New("fencelock: not held")

	// ErrLeaseLost matches every [*LeaseLostError]: the holder must stop acting on the lease.
	ErrLeaseLost = errors.New("fencelock: lease lost")

	// ErrTrustWindowExpired is the cause inside a [*LeaseLostError] when no renewal succeeded
	// before the holder's trust window ended, whatever the database may still say.
	ErrTrustWindowExpired = errors.New("fencelock: trust window expired")

	// ErrReleased is what Lease.Err reports after the holder released the lease itself.
	ErrReleased = errors.New("fencelock: lease released")

	// ErrStaleToken matches every [*StaleTokenError]: a newer fencing token has been seen for
	// the resource, so the write carrying the older one was rejected.
	ErrStaleToken = errors.New("fencelock: stale fencing token")

	// ErrNoRow is returned by [UpdateFencedTx] when no row matches the key at all, which is
	// not the same as a stale token.
	ErrNoRow = errors.New("fencelock: no row matches the key")

	// ErrReadOnly is returned when the server refuses writes: a hot standby, or
	// default_transaction_read_only. A lock taken on a replica would not exclude anyone on the
	// primary, so fencelock refuses instead. Lease calls find out from the server's refusal
	// to write (SQLSTATE 25006, wrapped too); advisory locks from pg_is_in_recovery(), checked
	// in the lock statement before anything is taken. It is the same value as package
	// ratelimit's ErrReadOnly.
	ErrReadOnly = pgerr.ErrReadOnly
	// ErrTokenSequence is returned, wrapping the server's error (SQLSTATE FL001), when the
	// token sequence (fencelock.leases_token_seq) has CACHE > 1, CYCLE or an INCREMENT <= 0:
	// tokens for a name could then go backwards or repeat, so no token is issued. Fix it with
	// ALTER SEQUENCE fencelock.leases_token_seq CACHE 1 INCREMENT 1 NO CYCLE.
	ErrTokenSequence = errors.New("fencelock: token sequence misconfigured (CACHE > 1, CYCLE or INCREMENT <= 0); no token issued")
	// ErrTokenBudget is returned, wrapping the server's error (SQLSTATE FL002), when a token
	// would not fit the layout of [Token]: the sequence fencelock.leases_token_seq is past
	// 2^47 - 1, or the epoch (timeline plus offset) is past 65535. No token is issued and
	// nothing is held: a token that no longer carries the epoch could go backwards after a
	// failover. Migration 00003 fails with the same SQLSTATE when the sequence is already past
	// 2^47 - 1, and so does [RebaseTokenEpoch] when the epoch would pass 65535.
	ErrTokenBudget = errors.New("fencelock: token budget exhausted (sequence past 2^47 - 1 or epoch past 65535); no token issued")
	// ErrTokenEpochBehind is returned, wrapping the server's error (SQLSTATE FL003), when the
	// server's token epoch (timeline plus offset, see [Token]) is below the highest epoch the
	// database has issued tokens in: the timeline went back, as it does after pg_upgrade or a
	// logical copy (dump and restore) onto another cluster. No token is issued and nothing is
	// held, since every new token would be smaller than tokens already handed out.
	// [RebaseTokenEpoch] fixes it.
	ErrTokenEpochBehind = errors.New("fencelock: token epoch below the highest one issued (timeline went back: pg_upgrade, logical copy?); call RebaseTokenEpoch; no token issued")
	// ErrNoToken is returned, wrapping the server's error (SQLSTATE FL006), when a write to
	// a table protected by fencelock.protect_table carried no fencing token: no
	// fencelock.set_token in its transaction, and no new value in the table's token column
	// (docs/SQL.md). Nothing was written.
	ErrNoToken = errors.New("fencelock: the write carries no fencing token (fencelock.set_token or the token column)")
	// ErrTokenNotIssued is returned, wrapping the server's error (SQLSTATE FL008), when a
	// fencing token is larger than every token the database has issued (migration 00017,
	// fencelock.issued_bound: the highest epoch it drew tokens in, shifted left 47, with the
	// token sequence's last value): no grant returned it. [FenceTx], [UpdateFencedTx], their
	// database/sql twins, fencelock.fence, fencelock.set_token and a protected table's trigger
	// refuse it before they write anything; a made-up token would otherwise pass every fence
	// and then refuse every legitimate holder, for ever. A token that a grant of this database
	// returned is never refused so, whatever happened since (epochs, [RebaseTokenEpoch],
	// failovers). docs/SECURITY.md says why.
	ErrTokenNotIssued = errors.New("fencelock: fencing token never issued by this database (larger than every token granted)")
)

// ArgumentError reports bad input, found before any SQL ran: Arg names the parameter or option
// (e.g. "name", "ttl", "WithHeartbeatInterval"), Reason says what is wrong with it. It matches
// [ErrInvalidArgument] under [errors.Is]. Package ratelimit returns the same type (its
// ArgumentError is this one), so one errors.As matches the bad input of both.
type ArgumentError = validate.ArgumentError

// argError returns an [*ArgumentError] for arg, its Reason formatted as by fmt.Sprintf.
func argError(arg, format string, a ...any) error {
	return validate.Errorf(arg, format, a...)
}

// StaleTokenError reports a fenced write rejected because its resource has already seen
// fencing token Current, newer than the writer's Token. It matches [ErrStaleToken] under
// [errors.Is]. The caller's transaction has changed nothing through the rejected call; roll it
// back.
//
// From [FenceTx] and [Lease.FenceTx], Resource names the fence (a row of fencelock.fences) and
// Table and Key are empty. From [UpdateFencedTx], Resource is empty, Table is the table as
// given (schema.name, unquoted) and Key the key it matched ("sku=\"A-1\", warehouse=3"); Current
// is then the largest token among the matched rows.
type StaleTokenError struct {
	Resource string
	Table    string
	Key      string
	Token    Token // the writer's token
	Current  Token // the resource's high-water mark (or the row's token) when the write was rejected
}

// Error describes the StaleTokenError: the fence or the table and row, the writer's token and
// the one that rejected it.
func (e *StaleTokenError) Error() string {
	if e.Table != "" {
		return fmt.Sprintf("fencelock: stale fencing token %d for table %s, row %s: the row carries token %d", e.Token, e.Table, e.Key, e.Current)
	}
	return fmt.Sprintf("fencelock: stale fencing token %d for resource %q: high-water mark is %d", e.Token, e.Resource, e.Current)
}

// Is reports whether target is [ErrStaleToken].
func (e *StaleTokenError) Is(target error) bool { return target == ErrStaleToken }

// LeaseLostError reports that a lease can no longer be trusted: a renewal found it expired or
// taken over on the server, or its trust window ended before a renewal succeeded (Cause is
// then [ErrTrustWindowExpired], wrapping the last renewal error if there was one). It matches
// [ErrLeaseLost] under [errors.Is] and unwraps to Cause.
type LeaseLostError struct {
	Name  string
	Token Token
	Cause error
}

// Error describes the LeaseLostError.
func (e *LeaseLostError) Error() string {
	return fmt.Sprintf("fencelock: lease %q (token %d) lost: %v", e.Name, e.Token, e.Cause)
}

// Is reports whether target is [ErrLeaseLost].
func (e *LeaseLostError) Is(target error) bool { return target == ErrLeaseLost }

// Unwrap returns Cause.
func (e *LeaseLostError) Unwrap() error { return e.Cause }

// errRefused is an attempt's internal "someone else holds it": distinct from ErrNotAcquired,
// so that a wait never mistakes a caller's error (fn's, in RunLocked) for contention. The
// exported calls return ErrNotAcquired in its place.
var errRefused = errors.New("fencelock: grant refused")

// lateGrant is a grant whose reply came after its trust window, released at once: useless to
// its holder. Inside an attempt's loop it is a refusal (errors.Is errRefused: Acquire tries
// again); a try returns it as [ErrNotAcquired] (errors.Is), with a message that says what
// happened rather than "held by another holder".
type lateGrant struct {
	what string        // `lease "name"`, `the set of 3 leases`
	ttl  time.Duration // the grant's TTL
}

func (e *lateGrant) Error() string {
	return fmt.Sprintf("fencelock: not acquired: %s was granted, but its reply came after its trust window (TTL %v): released at once", e.what, e.ttl)
}

// Is reports whether target is [ErrNotAcquired] or errRefused.
func (e *lateGrant) Is(target error) bool { return target == ErrNotAcquired || target == errRefused }

// errGoneOnServer is the cause of a loss the database reported.
var errGoneOnServer = errors.New("the database no longer has this grant (expired or taken over)")

// sqlState returns the SQLSTATE of the first error in err's chain that reports one (pgx's
// *pgconn.PgError, lib/pq's *pq.Error: both have SQLState), "" when none does.
func sqlState(err error) string {
	var e interface{ SQLState() string }
	if errors.As(err, &e) {
		return e.SQLState()
	}
	return ""
}

// pgCode returns the SQLSTATE of the Postgres error in err's chain, "" when there is none.
func pgCode(err error) string { return sqlState(err) }

// sentinelFor is the sentinel a SQLSTATE of fencelock's SQL (or the server's read-only
// refusal) maps to, nil for any other.
func sentinelFor(code string) error {
	switch code {
	case "25006": // read_only_sql_transaction
		return ErrReadOnly
	case "FL001": // fencelock.next_token
		return ErrTokenSequence
	case "FL002": // fencelock.next_token
		return ErrTokenBudget
	case "FL003": // fencelock.next_token
		return ErrTokenEpochBehind
	case "FL004": // fencelock.fence, a protected table's trigger
		return ErrStaleToken
	case "FL005": // fencelock.guard_lease, renew
		return ErrLeaseLost
	case "FL006": // a protected table's trigger
		return ErrNoToken
	case "FL007": // the SQL API's argument checks
		return ErrInvalidArgument
	case "FL008": // fencelock.check_issued
		return ErrTokenNotIssued
	}
	return nil
}

// wrapPg wraps err from a statement with what, and with the sentinel its SQLSTATE maps to
// (see [WrapSQLError]).
func wrapPg(what string, err error) error {
	if s := sentinelFor(sqlState(err)); s != nil {
		return fmt.Errorf("%s: %w: %w", what, s, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// WrapSQLError returns err wrapped with the sentinel of this package that its SQLSTATE stands
// for, so that errors.Is tells fencelock's refusals apart whichever client ran the statement:
// an error from the SQL API or a protected table's trigger (docs/SQL.md) reached through GORM,
// bun, sqlx or plain database/sql, with pgx's stdlib or lib/pq. The SQLSTATE is read from the
// first error in err's chain with a SQLState() string method (*pgconn.PgError, *pq.Error):
//
//	FL001 ErrTokenSequence, FL002 ErrTokenBudget, FL003 ErrTokenEpochBehind,
//	FL004 ErrStaleToken, FL005 ErrLeaseLost, FL006 ErrNoToken, FL007 ErrInvalidArgument,
//	FL008 ErrTokenNotIssued, 25006 ErrReadOnly
//
// The driver's error stays in the chain (errors.As still finds it). Any other error, and nil,
// is returned as is. The calls of this package wrap their errors so already. Safe for
// concurrent use.
func WrapSQLError(err error) error {
	if s := sentinelFor(sqlState(err)); s != nil && !errors.Is(err, s) {
		return fmt.Errorf("%w: %w", s, err)
	}
	return err
}

// Advisory-lock errors.
var (
	// ErrLockLost matches every [*SessionLostError]: the session that held an advisory lock
	// ended (backend terminated, server restarted, connection broken), so the lock is gone.
	ErrLockLost = errors.New("fencelock: advisory lock lost")

	// ErrUnlocked is what AdvisoryLock.Err reports after the holder unlocked it itself.
	ErrUnlocked = errors.New("fencelock: advisory lock unlocked")

	// ErrAlreadyHeld is returned when a [Lessor] is asked for a lease it already holds (an
	// Acquire waiting for the name meanwhile returns it once another call of the lessor got the
	// lease), or an [AdvisoryLocker] for a lock it already holds or is acquiring: neither is
	// re-entrant (advisory locks stack in Postgres, and a silent second level would outlive the
	// first Unlock; a second grant of a lease to one holder would share one token between two
	// callers). See also [*KeyCollisionError].
	ErrAlreadyHeld = errors.New("fencelock: already held or being acquired by this holder (a lessor or advisory locker is not re-entrant)")

	// ErrTooManyLocks is returned when an [AdvisoryLocker] already holds its cap of session
	// locks ([WithMaxSessionLocks]); each holds a pooled connection and a slot of the server's lock
	// table.
	ErrTooManyLocks = errors.New("fencelock: advisory locker holds too many locks")

	// ErrConnectionPooler matches every [*PoolerError]: a session lock needs a server session of
	// its own, and a connection pooler (PgBouncer, RDS Proxy, ...) sits between the client and the
	// server. Use the transaction-scoped locks (TryLockTx, LockTx) or leases instead, or, for a
	// pooler that pins a server session to each client connection (PgBouncer's session mode),
	// declare it with [WithSessionPooler].
	ErrConnectionPooler = errors.New("fencelock: connection goes through a pooler; session advisory locks need a server session of their own: use transaction locks (LockTx) or leases, or WithSessionPooler for a session-mode pooler")
)

// PoolerError reports a session lock refused because the backend pid the server reports
// differs from the one the connection was given at startup: a pooler answers for the server.
// It matches [ErrConnectionPooler].
type PoolerError struct {
	StartupPID, BackendPID uint32
}

// Error describes the PoolerError.
func (e *PoolerError) Error() string {
	return fmt.Sprintf("%v (connection reported pid %d at startup, the server session is pid %d)", ErrConnectionPooler, e.StartupPID, e.BackendPID)
}

// Is reports whether target is [ErrConnectionPooler].
func (e *PoolerError) Is(target error) bool { return target == ErrConnectionPooler }
