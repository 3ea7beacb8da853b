package validate

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestArgumentError(t *testing.T) {
	t.Parallel()
	err := Errorf("limit.Rate", "is %d; it must be at least 1", 0)
	require.Equal(t, "fencelock: invalid limit.Rate: is 0; it must be at least 1", err.Error())
	require.ErrorIs(t, err, ErrInvalidArgument)
	var ae *ArgumentError
	require.ErrorAs(t, err, &ae)
	require.Equal(t, "limit.Rate", ae.Arg)
	require.False(t, errors.Is(errors.New("other"), ErrInvalidArgument))
}

func TestName(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		desc, name, reason string
	}{
		{"Empty", "", "must not be empty"},
		{"OverLong", strings.Repeat("n", MaxNameLength+1), "is 1025 bytes long; the limit is 1024"},
		{"InvalidUTF8", "a\xffb", "is not valid UTF-8"},
		{"NUL", "a\x00b", "contains a NUL byte"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			var ae *ArgumentError
			require.ErrorAs(t, Name("key", tc.name), &ae)
			require.Equal(t, ArgumentError{Arg: "key", Reason: tc.reason}, *ae)
		})
	}
	require.NoError(t, Name("key", strings.Repeat("n", MaxNameLength)))
	require.NoError(t, Text("holder", "", 10), "Text allows empty")
}
