package fencelock

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// The messages name what a user must look at: the fence or the table and row of a stale write,
// and, for a second acquire, a holder that is not re-entrant (not an advisory lock where a
// lease was asked for).
func TestErrorMessages(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{&StaleTokenError{Resource: "payment:42", Token: 7, Current: 9},
			`fencelock: stale fencing token 7 for resource "payment:42": high-water mark is 9`},
		{&StaleTokenError{Table: "public.inventory", Key: describeKey([]Column{{Name: "sku", Value: "A-1"}, {Name: "bin", Value: 3}}), Token: 1, Current: 5},
			`fencelock: stale fencing token 1 for table public.inventory, row sku="A-1", bin=3: the row carries token 5`},
		{fmt.Errorf("acquire lease %q: %w", "inventory", ErrAlreadyHeld),
			`acquire lease "inventory": fencelock: already held or being acquired by this holder (a lessor or advisory locker is not re-entrant)`},
	} {
		require.Equal(t, tc.want, tc.err.Error())
	}
	require.True(t, errors.Is(&StaleTokenError{Table: "t"}, ErrStaleToken))
}
