package pgserver

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// An existing server's address keeps its form: a URL gets its path replaced, a keyword/value
// string a dbname appended (quoted); the database it names is the maintenance database.
func TestParseAddr(t *testing.T) {
	for _, tc := range []struct{ raw, maint, url string }{
		{"postgres://u:p@h:5433/admin?sslmode=disable", "admin", "postgres://u:p@h:5433/t_1?sslmode=disable"},
		{"postgresql://u@h/admin", "admin", "postgresql://u@h/t_1"},
		{"host=h port=5433 user=u dbname=admin", "admin", "host=h port=5433 user=u dbname=admin dbname='t_1'"},
	} {
		addr, maint, err := ParseAddr(tc.raw)
		require.NoError(t, err, tc.raw)
		require.Equal(t, tc.maint, maint, tc.raw)
		require.Equal(t, tc.url, addr.URL("t_1"), tc.raw)
	}
	_, _, err := ParseAddr("postgres://h:notaport/db")
	require.Error(t, err)
}

// Settings become postgres's -c flags, in order.
func TestFlags(t *testing.T) {
	require.Equal(t, []string{"-c", "fsync=off", "-c", "port=1"}, Flags([]Setting{{"fsync", "off"}, {"port", "1"}}))
	require.Empty(t, Flags(nil))
}

// A log that says the port was taken is a bind error; another failure is not.
func TestIsBindError(t *testing.T) {
	require.True(t, IsBindError(`LOG:  could not bind IPv4 address "127.0.0.1": Address already in use`))
	require.True(t, IsBindError("FATAL:  could not create any TCP/IP sockets"))
	require.False(t, IsBindError("FATAL:  data directory has invalid permissions"))
}
