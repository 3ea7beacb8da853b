package chaos

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock"
)

// Classify maps the error of a write transaction to its [Outcome]: nil is OK; a stale token,
// a refused lock, bad input, an error that pgx says was never sent, and an error the server
// reported for a statement (which aborted the transaction) are Fail; anything else (a broken
// connection, an ended context, the server going down mid-commit) is Unknown, since the
// commit may have happened.
//
// pgx's "conn closed" ([pgconn.ErrConnClosed]) is Unknown although pgx says it is safe to
// retry: pgx v5.12.0 also returns it from PgConn.receiveMessage (pgconn/pgconn.go:719) when the
// connection broke after the statement was sent, e.g. a COMMIT whose reply was lost to a
// connection reset: the commit happened (scenario 4 found this).
func Classify(err error) Outcome {
	if err == nil {
		return OK
	}
	if errors.Is(err, pgconn.ErrConnClosed) {
		return Unknown
	}
	if errors.Is(err, fencelock.ErrStaleToken) || errors.Is(err, fencelock.ErrNotAcquired) ||
		errors.Is(err, fencelock.ErrInvalidArgument) || errors.Is(err, fencelock.ErrLeaseLost) ||
		pgconn.SafeToRetry(err) {
		return Fail
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code[:2] {
		case "08", "57", "58", "XX", "53": // connection, operator intervention, system: maybe committed
			return Unknown
		}
		return Fail
	}
	return Unknown
}

// MeasureOffset estimates the database clock minus the local wall clock, from the round trip
// of SELECT clock_timestamp() with the smallest delay among a few tries. Its error is at most
// half that round trip.
func MeasureOffset(ctx context.Context, pool *pgxpool.Pool) (time.Duration, error) {
	best, bestRTT := time.Duration(0), time.Duration(-1)
	for range 5 {
		sent := time.Now()
		var server time.Time
		if err := pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&server); err != nil {
			return 0, err
		}
		rtt := time.Since(sent)
		if bestRTT < 0 || rtt < bestRTT {
			best, bestRTT = server.Sub(sent.Round(0).Add(rtt/2)), rtt
		}
	}
	return best, nil
}
