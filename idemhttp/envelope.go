package idemhttp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/idemkit/idempotency/coordinator"
)

// response is a handler's response: recorded live, or decoded from the store.
type response struct {
	status int
	header http.Header
	body   []byte
	// replayed is set on a response decoded from the store.
	replayed bool
	// sent is set when the response already went to the client (streamed or
	// hijacked).
	sent bool
	// unstorable says why the response cannot be stored ("" when it can).
	unstorable string
}

// envelopeVersion is the stored format's version. Readers ignore fields they
// do not know, so adding one is compatible; a new version is for changes old
// readers must refuse, and a refused record is replaced by a fresh run of the
// handler (the coordinator heals it), so bump it only with care.
const envelopeVersion = 1

// envelope is the first line of a stored response; the raw body follows the
// newline. JSON keeps the record readable in redis-cli; the raw body keeps it
// compact (no base64).
type envelope struct {
	V      int                 `json:"v"`
	Status int                 `json:"status"`
	Header map[string][]string `json:"header,omitempty"`
}

// codec stores responses as a JSON envelope line followed by the body. Its
// Encode refuses responses that cannot be stored, so that the coordinator
// reports them (record_validation_error), releases the key and still returns
// the live response; its Decode refuses what it cannot read, so that the
// coordinator heals the record.
type codec struct {
	replay map[string]bool
}

var _ coordinator.Codec[*response] = codec{}

func (c codec) Encode(r *response) ([]byte, error) {
	if r.unstorable != "" {
		return nil, fmt.Errorf("idemhttp: the response was sent but not stored: %s", r.unstorable)
	}
	meta, err := json.Marshal(envelope{V: envelopeVersion, Status: r.status, Header: c.filter(r.header)})
	if err != nil {
		return nil, fmt.Errorf("idemhttp: encode response: %w", err)
	}
	b := make([]byte, 0, len(meta)+1+len(r.body))
	b = append(b, meta...)
	b = append(b, '\n')
	return append(b, r.body...), nil
}

func (c codec) Decode(b []byte) (*response, error) {
	meta, body, ok := bytes.Cut(b, []byte{'\n'})
	if !ok {
		return nil, errors.New("idemhttp: stored response has no envelope")
	}
	var e envelope
	if err := json.Unmarshal(meta, &e); err != nil {
		return nil, fmt.Errorf("idemhttp: stored response envelope: %w", err)
	}
	if e.V != envelopeVersion {
		return nil, fmt.Errorf("idemhttp: stored response has envelope version %d, want %d", e.V, envelopeVersion)
	}
	if e.Status < 200 || e.Status > 999 {
		return nil, fmt.Errorf("idemhttp: stored response has status %d", e.Status)
	}
	return &response{status: e.Status, header: c.filter(e.Header), body: body, replayed: true}, nil
}

// filter returns the headers of h that are stored and replayed. It runs when
// storing and again when replaying, so a narrowed allow-list applies to
// records stored before, and a record never replays a forbidden header.
func (c codec) filter(h http.Header) http.Header {
	out := make(http.Header)
	for k, vs := range h {
		k = http.CanonicalHeaderKey(k)
		if c.replay[k] && !neverReplayed(k) && len(vs) > 0 {
			out[k] = append(out[k], vs...)
		}
	}
	return out
}
