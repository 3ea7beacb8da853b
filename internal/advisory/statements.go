package advisory

import (
	"context"

	"github.com/fencelock/fencelock/internal/db"
)

var queries = db.New()

// Request is what a lock statement takes: the key, described by Name ("" for a lock taken by
// key; the lock statement does not use it), in shared or exclusive mode, waiting in the
// server's queue or only trying, with or without a fencing token.
type Request struct {
	Name   string
	Key    Key
	Shared bool
	Wait   bool
	Tokens bool
}

// Grant is what a session lock statement reports: whether the session was refused before it
// locked, and why (InRecovery, or BackendPid differing from the pid the connection reported at
// startup), else whether the lock was granted, with its token (0 without one); PrevApp is the
// session's application_name at the grant, the one to put back on unlock if the watchdog
// labels the lock ([LabelSession]).
type Grant struct {
	Refused    bool
	InRecovery bool
	BackendPid int32
	Granted    bool
	Token      int64
	PrevApp    string
}

// Results of the statements of a session lock on an int64 key (AdvisoryLockTryKey and its
// kind): the token, 0 without one, when granted; else one of these.
const (
	grantRefused    = -2
	grantNotGranted = -1
)

// LockSession takes r's session lock on conn, a connection of the lock's own, in one
// statement. It leaves application_name alone: the watchdog labels a lock still held at its
// first probe ([LabelSession]), which keeps the set_config and its ParameterStatus message off
// the lock and unlock pair (issue 31). startupPID is the backend pid the connection reported
// at startup, checked against the server's before it locks; 0 skips the check (a declared
// session pooler). appNow is the session's application_name as the server last reported it
// (pgconn's ParameterStatus), returned as the Grant's PrevApp.
//
// An int64 key with a startup pid to check takes the statement of its lock function
// (AdvisoryLockTryKey, AdvisoryLockTryKeyShared, AdvisoryLockWaitKey,
// AdvisoryLockWaitKeyShared): one column, three arguments; a refusal, which never happens on
// a healthy direct connection, costs a second statement (AdvisorySessionState) that says why. A
// pair key, or a session pooler (whose backend pid is not the startup pid, and is returned),
// takes AdvisoryLock, which picks the function by CASE. The Grant says whether it was granted,
// or why the session was refused (in recovery, another pid); the caller turns that into
// errors. pgx's error is returned as is.
func LockSession(ctx context.Context, conn db.DBTX, r Request, startupPID int32, appNow string) (Grant, error) {
	if r.Key.Pair || startupPID == 0 {
		row, err := queries.AdvisoryLock(ctx, conn, db.AdvisoryLockParams{
			StartupPid: startupPID,
			Tokens:     r.Tokens,
			Wait:       r.Wait,
			Pair:       r.Key.Pair, K1: r.Key.K1, K2: r.Key.K2, Key: r.Key.Int64,
			Shared: r.Shared,
		})
		return Grant{
			Refused:    !row.Granted && (row.InRecovery || (startupPID != 0 && row.BackendPid != startupPID)),
			InRecovery: row.InRecovery,
			BackendPid: row.BackendPid,
			Granted:    row.Granted,
			Token:      row.Token,
			PrevApp:    appNow,
		}, err
	}
	var (
		res int64
		err error
	)
	switch {
	case r.Wait && r.Shared:
		res, err = queries.AdvisoryLockWaitKeyShared(ctx, conn, db.AdvisoryLockWaitKeySharedParams{
			StartupPid: startupPID, Key: r.Key.Int64, Tokens: r.Tokens,
		})
	case r.Wait:
		res, err = queries.AdvisoryLockWaitKey(ctx, conn, db.AdvisoryLockWaitKeyParams{
			StartupPid: startupPID, Key: r.Key.Int64, Tokens: r.Tokens,
		})
	case r.Shared:
		res, err = queries.AdvisoryLockTryKeyShared(ctx, conn, db.AdvisoryLockTryKeySharedParams{
			StartupPid: startupPID, Key: r.Key.Int64, Tokens: r.Tokens,
		})
	default:
		res, err = queries.AdvisoryLockTryKey(ctx, conn, db.AdvisoryLockTryKeyParams{
			StartupPid: startupPID, Key: r.Key.Int64, Tokens: r.Tokens,
		})
	}
	switch {
	case err != nil:
		return Grant{}, err
	case res == grantRefused:
		st, err := queries.AdvisorySessionState(ctx, conn)
		if err != nil {
			return Grant{}, err
		}
		// The same pid as at startup: the refusal was the recovery's (a promotion may have
		// ended it since).
		return Grant{Refused: true, InRecovery: st.InRecovery || st.BackendPid == startupPID, BackendPid: st.BackendPid}, nil
	case res == grantNotGranted:
		return Grant{BackendPid: startupPID}, nil
	}
	return Grant{Granted: true, Token: res, BackendPid: startupPID, PrevApp: appNow}, nil
}

// UnlockSession releases key's session lock on conn, in one statement. labelled says whether
// the watchdog labelled the lock ([LabelSession]): if so the statement also puts prevApp back
// as application_name (AdvisoryUnlockKey or AdvisoryUnlockKeyShared for an int64 key), else
// it only unlocks and leaves application_name untouched (AdvisoryUnlockKeyBare or
// AdvisoryUnlockKeySharedBare). A pair key takes AdvisoryUnlock, with labelled as its flag.
// released is false when the session did not hold the lock (application_name is then left
// as it was). pgx's error is returned as is.
func UnlockSession(ctx context.Context, conn db.DBTX, key Key, shared, labelled bool, prevApp string) (released bool, err error) {
	switch {
	case key.Pair:
		return queries.AdvisoryUnlock(ctx, conn, db.AdvisoryUnlockParams{
			Pair: key.Pair, K1: key.K1, K2: key.K2, Key: key.Int64,
			Shared:              shared,
			Labelled:            labelled,
			PrevApplicationName: prevApp,
		})
	case !labelled && shared:
		return queries.AdvisoryUnlockKeySharedBare(ctx, conn, key.Int64)
	case !labelled:
		return queries.AdvisoryUnlockKeyBare(ctx, conn, key.Int64)
	case shared:
		return queries.AdvisoryUnlockKeyShared(ctx, conn, db.AdvisoryUnlockKeySharedParams{Key: key.Int64, PrevApplicationName: prevApp})
	}
	return queries.AdvisoryUnlockKey(ctx, conn, db.AdvisoryUnlockKeyParams{Key: key.Int64, PrevApplicationName: prevApp})
}

// LockTx takes r's transaction lock inside tx, the caller's transaction, in one statement
// (AdvisoryLockTx); r.Name is not used. pgx's error is returned as is.
func LockTx(ctx context.Context, tx db.DBTX, r Request) (db.AdvisoryLockTxRow, error) {
	return queries.AdvisoryLockTx(ctx, tx, db.AdvisoryLockTxParams{
		Tokens: r.Tokens,
		Wait:   r.Wait,
		Pair:   r.Key.Pair, K1: r.Key.K1, K2: r.Key.K2, Key: r.Key.Int64,
		Shared: r.Shared,
	})
}
