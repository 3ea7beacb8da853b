package fencelock

import "fmt"

// The errors of advisory locks that carry a key; their sentinels are in errors.go.

// SessionLostError reports that the session holding an advisory lock ended. It matches
// [ErrLockLost] under [errors.Is] and unwraps to Cause (the probe's error, or
// [ErrConnectionPooler] when the backend changed under the connection).
type SessionLostError struct {
	Key   AdvisoryKey
	Name  string // "" for a lock taken by key
	Cause error
}

// Error describes the SessionLostError.
func (e *SessionLostError) Error() string {
	return fmt.Sprintf("fencelock: advisory lock %s lost: %v", describeLock(e.Name, e.Key), e.Cause)
}

// Is reports whether target is [ErrLockLost].
func (e *SessionLostError) Is(target error) bool { return target == ErrLockLost }

// Unwrap returns Cause.
func (e *SessionLostError) Unwrap() error { return e.Cause }

// KeyCollisionError reports that two different names map to the same advisory key within one
// [AdvisoryLocker] (a weak [KeyHash], or a namespace clash). It matches [ErrAlreadyHeld].
type KeyCollisionError struct {
	Key        AdvisoryKey
	Name, Held string // the name asked for, and the name holding the key
}

// Error describes the KeyCollisionError.
func (e *KeyCollisionError) Error() string {
	return fmt.Sprintf("fencelock: advisory key collision: %q and %q (held) both map to %v", e.Name, e.Held, e.Key)
}

// Is reports whether target is [ErrAlreadyHeld].
func (e *KeyCollisionError) Is(target error) bool { return target == ErrAlreadyHeld }
