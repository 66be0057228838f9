// tlogcheck verifies a Lethe log with Go's reference packages (golang.org/x/mod/sumdb/note
// and sumdb/tlog), reading only its public C2SP endpoints: the checkpoint's note signature
// against a pinned vkey, the tree hash rebuilt from the tiles, an entry's inclusion from the
// entry bundle, and the consistency of an older checkpoint. Built and run by
// tests/test_log.py; it prints "ok" and exits 0, or says what failed and exits 1.
//
//	tlogcheck <log URL prefix> <vkey> <entry index> [<older checkpoint file>]
package main

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

func fail(format string, args ...interface{}) {
	fmt.Printf("FAIL: "+format+"\n", args...)
	os.Exit(1)
}

func get(url string) []byte {
	resp, err := http.Get(url)
	if err != nil {
		fail("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		fail("GET %s: status %d %v", url, resp.StatusCode, err)
	}
	return body
}

// indexPath encodes a tile index as C2SP tlog-tiles does: 3-digit groups, all but the last
// prefixed by "x".
func indexPath(n int64) string {
	s := strconv.FormatInt(n, 10)
	for len(s)%3 != 0 {
		s = "0" + s
	}
	var parts []string
	for i := 0; i < len(s); i += 3 {
		parts = append(parts, s[i:i+3])
	}
	for i := 0; i < len(parts)-1; i++ {
		parts[i] = "x" + parts[i]
	}
	return strings.Join(parts, "/")
}

func tilePath(level string, n int64, w int) string {
	p := "tile/" + level + "/" + indexPath(n)
	if w < 256 {
		p += ".p/" + strconv.Itoa(w)
	}
	return p
}

type tiles struct{ base string }

func (t tiles) Height() int { return 8 }

func (t tiles) ReadTiles(ts []tlog.Tile) ([][]byte, error) {
	out := make([][]byte, len(ts))
	for i, tile := range ts {
		out[i] = get(t.base + "/" + tilePath(strconv.Itoa(tile.L), tile.N, tile.W))
	}
	return out, nil
}

func (t tiles) SaveTiles(ts []tlog.Tile, data [][]byte) {}

func parseCheckpoint(text string) (string, int64, tlog.Hash) {
	lines := strings.Split(text, "\n")
	if len(lines) < 4 {
		fail("checkpoint has %d lines", len(lines))
	}
	size, err := strconv.ParseInt(lines[1], 10, 64)
	if err != nil {
		fail("checkpoint size: %v", err)
	}
	raw, err := base64.StdEncoding.DecodeString(lines[2])
	if err != nil || len(raw) != tlog.HashSize {
		fail("checkpoint root: %v", err)
	}
	var h tlog.Hash
	copy(h[:], raw)
	return lines[0], size, h
}

func main() {
	if len(os.Args) < 4 {
		fail("usage: tlogcheck <url> <vkey> <index> [<older checkpoint>]")
	}
	base, vkey := strings.TrimRight(os.Args[1], "/"), strings.TrimSpace(os.Args[2])
	index, err := strconv.ParseInt(os.Args[3], 10, 64)
	if err != nil {
		fail("index: %v", err)
	}
	verifier, err := note.NewVerifier(vkey)
	if err != nil {
		fail("vkey: %v", err)
	}
	msg := get(base + "/checkpoint")
	n, err := note.Open(msg, note.VerifierList(verifier))
	if err != nil {
		fail("checkpoint signature: %v", err)
	}
	origin, size, root := parseCheckpoint(n.Text)
	if origin != verifier.Name() {
		fail("origin %q is not the key's name %q", origin, verifier.Name())
	}
	reader := tlog.TileHashReader(tlog.Tree{N: size, Hash: root}, tiles{base})
	rebuilt, err := tlog.TreeHash(size, reader)
	if err != nil || rebuilt != root {
		fail("tree hash from tiles: %v (%v vs %v)", err, rebuilt, root)
	}
	// the entry, from its bundle, and its inclusion proof from the tiles
	bundleIndex := index / 256
	width := size - bundleIndex*256
	if width > 256 {
		width = 256
	}
	bundle := get(base + "/" + tilePath("entries", bundleIndex, int(width)))
	var entry []byte
	for i, r := int64(0), bytes.NewReader(bundle); r.Len() > 0; i++ {
		var n uint16
		if err := binary.Read(r, binary.BigEndian, &n); err != nil {
			fail("bundle: %v", err)
		}
		data := make([]byte, n)
		if _, err := io.ReadFull(r, data); err != nil {
			fail("bundle: %v", err)
		}
		if i == index%256 {
			entry = data
		}
	}
	if entry == nil {
		fail("entry %d not in its bundle", index)
	}
	proof, err := tlog.ProveRecord(size, index, reader)
	if err != nil {
		fail("prove record: %v", err)
	}
	if err := tlog.CheckRecord(proof, size, root, index, tlog.RecordHash(entry)); err != nil {
		fail("inclusion: %v", err)
	}
	for _, w := range os.Args[5:] {
		checkCosignature(string(msg), n.Text, w)
	}
	if len(os.Args) > 4 && os.Args[4] != "-" {
		older, err := os.ReadFile(os.Args[4])
		if err != nil {
			fail("older checkpoint: %v", err)
		}
		o, err := note.Open(older, note.VerifierList(verifier))
		if err != nil {
			fail("older checkpoint signature: %v", err)
		}
		_, oldSize, oldRoot := parseCheckpoint(o.Text)
		p, err := tlog.ProveTree(size, oldSize, reader)
		if err != nil {
			fail("prove tree: %v", err)
		}
		if err := tlog.CheckTree(p, size, root, oldSize, oldRoot); err != nil {
			fail("consistency: %v", err)
		}
	}
	fmt.Printf("ok %s size %d entry %d\n", origin, size, index)
}

// checkCosignature finds the witness's signature line in the note and verifies it: key id
// SHA-256(name || "\n" || 0x04 || key)[:4], signature over
// "cosignature/v1\ntime <t>\n" || the checkpoint text, as a big-endian u64 time and 64 bytes.
func checkCosignature(note, text, vkey string) {
	parts := strings.SplitN(strings.TrimSpace(vkey), "+", 3)
	if len(parts) != 3 {
		fail("witness vkey %q", vkey)
	}
	raw, err := base64.StdEncoding.DecodeString(parts[2])
	if err != nil || len(raw) != 33 || raw[0] != 0x04 {
		fail("witness vkey %q is not a cosignature key", vkey)
	}
	name, pub := parts[0], ed25519.PublicKey(raw[1:])
	h := sha256.Sum256(append([]byte(name+"\n\x04"), pub...))
	if hex.EncodeToString(h[:4]) != parts[1] {
		fail("witness vkey %q: wrong key id", vkey)
	}
	for _, line := range strings.Split(note, "\n") {
		if !strings.HasPrefix(line, "\u2014 "+name+" ") {
			continue
		}
		sig, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(line, "\u2014 "+name+" "))
		if err != nil || len(sig) != 4+8+64 || !bytes.Equal(sig[:4], h[:4]) {
			continue
		}
		t := binary.BigEndian.Uint64(sig[4:12])
		message := fmt.Sprintf("cosignature/v1\ntime %d\n%s", t, text)
		if !ed25519.Verify(pub, []byte(message), sig[12:]) {
			fail("cosignature by %s does not verify", name)
		}
		return
	}
	fail("no cosignature by %s", name)
}
