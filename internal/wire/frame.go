package wire

import (
	"bytes"
	"encoding/json"
	"errors"
)

// ErrNoEnvelope is returned by Unframe for bytes without the newline that
// ends the envelope.
var ErrNoEnvelope = errors.New("no envelope")

// Frame returns the JSON encoding of envelope, a newline, and body: JSON
// keeps a record readable in redis-cli, the raw body keeps it compact (no
// base64).
func Frame(envelope any, body []byte) ([]byte, error) {
	meta, err := json.Marshal(envelope)
	if err != nil {
		return nil, err
	}
	b := make([]byte, 0, len(meta)+1+len(body))
	b = append(b, meta...)
	b = append(b, '\n')
	return append(b, body...), nil
}

// Unframe decodes the envelope line of b into envelope and returns the body
// after it. It returns ErrNoEnvelope when b has no newline, and
// json.Unmarshal's error when the line does not decode; fields envelope does
// not know are ignored.
func Unframe(b []byte, envelope any) ([]byte, error) {
	meta, body, ok := bytes.Cut(b, []byte{'\n'})
	if !ok {
		return nil, ErrNoEnvelope
	}
	if err := json.Unmarshal(meta, envelope); err != nil {
		return nil, err
	}
	return body, nil
}
