'use strict';
// The data chunks of a server-sent event stream (an OpenAI streaming response), each parsed and
// yielded as soon as its event has arrived whole; `data: [DONE]` is skipped (the stream ends it).
async function* sseChunks(res) {
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += dec.decode(value, { stream: true });
    let k;
    while ((k = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, k);
      buf = buf.slice(k + 2);
      if (ev.startsWith('data: ') && ev !== 'data: [DONE]') yield JSON.parse(ev.slice(6));
    }
  }
}

module.exports = { sseChunks };
