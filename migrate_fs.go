package fencelock

import (
	"bytes"
	"io"
	"io/fs"
	"strings"
)

// pinnedMigrations is an fs.FS of migrations whose Up sections each start with
// pinnedSearchPathSQL, so that a migration resolves every name as the migration's author meant
// whatever the search_path of the role or connection that runs it: the DDL of a migration runs
// as its caller, and a function, operator or view it creates or a statement it runs would
// otherwise resolve through a schema that another role may write to (docs/SECURITY.md). Each
// migration runs in a transaction of its own, which SET LOCAL does not outlive: the connection
// goes back to its pool (or PgBouncer) with its own search_path.
type pinnedMigrations struct{ fs.FS }

// pinnedSearchPathSQL is the statement pinnedMigrations puts first in each Up section.
const pinnedSearchPathSQL = "SET LOCAL search_path TO pg_catalog, pg_temp;\n"

func (p pinnedMigrations) Open(name string) (fs.File, error) {
	f, err := p.FS.Open(name)
	if err != nil || !strings.HasSuffix(name, ".sql") {
		return f, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, err
	}
	body, err := io.ReadAll(f)
	if err != nil {
		return nil, err
	}
	const up = "-- +goose Up\n"
	if i := bytes.Index(body, []byte(up)); i >= 0 {
		body = append(body[:i+len(up):i+len(up)], append([]byte(pinnedSearchPathSQL), body[i+len(up):]...)...)
	}
	return &memFile{Reader: bytes.NewReader(body), info: memInfo{FileInfo: info, size: int64(len(body))}}, nil
}

// memFile is a migration file as pinnedMigrations rewrote it.
type memFile struct {
	*bytes.Reader
	info memInfo
}

func (m *memFile) Stat() (fs.FileInfo, error) { return m.info, nil }
func (m *memFile) Close() error               { return nil }

type memInfo struct {
	fs.FileInfo
	size int64
}

func (i memInfo) Size() int64 { return i.size }
