package checkpoint

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/types"
)

// Encoder encodes checkpoints like Encode but keeps the JSON of every
// PrepareCompleted claim: a completed record is never changed again (it is
// only deleted, or rolled back to PrepareStarted when its write failed), so
// with hundreds of prepared claims a write re-encodes only the claims of
// the current call. Not safe for concurrent use.
type Encoder struct {
	cache map[*Claim][]byte
}

// Encode serializes the state with the envelope.
func (e *Encoder) Encode(bootID string, d *Data) ([]byte, error) {
	if e.cache == nil {
		e.cache = map[*Claim][]byte{}
	}
	uids := make([]types.UID, 0, len(d.Claims))
	for uid := range d.Claims {
		uids = append(uids, uid)
	}
	slices.Sort(uids)
	live := make(map[*Claim]bool, len(uids))
	var buf bytes.Buffer
	buf.WriteByte('{')
	if len(uids) > 0 {
		buf.WriteString(`"claims":{`)
		for i, uid := range uids {
			c := d.Claims[uid]
			live[c] = true
			raw, ok := e.cache[c]
			if !ok || c.State != PrepareCompleted {
				var err error
				if raw, err = json.Marshal(c); err != nil {
					return nil, fmt.Errorf("encode checkpoint claim %s: %w", uid, err)
				}
				if c.State == PrepareCompleted {
					e.cache[c] = raw
				} else {
					delete(e.cache, c)
				}
			}
			if i > 0 {
				buf.WriteByte(',')
			}
			key, _ := json.Marshal(string(uid))
			buf.Write(key)
			buf.WriteByte(':')
			buf.Write(raw)
		}
		buf.WriteByte('}')
	}
	buf.WriteByte('}')
	for c := range e.cache {
		if !live[c] {
			delete(e.cache, c)
		}
	}
	return wrap(bootID, buf.Bytes())
}

// wrap builds the envelope by hand: json.Marshal would re-scan and compact
// the (already compact) data, which costs more than encoding it.
func wrap(bootID string, data []byte) ([]byte, error) {
	// v3 only adds fields: a v2 reader keeps the meaning of the rest.
	head, err := json.Marshal(envelope{Version: Version, ReadableAs: VersionV2, BootID: bootID, Checksum: checksum(data)})
	if err != nil {
		return nil, fmt.Errorf("encode checkpoint envelope: %w", err)
	}
	// head ends in `"data":null}`; put the data in place of null.
	head = bytes.TrimSuffix(head, []byte("null}"))
	out := make([]byte, 0, len(head)+len(data)+1)
	out = append(append(append(out, head...), data...), '}')
	return out, nil
}
