// The microphone's AudioWorklet: turns the capture context's blocks (128 float samples
// at the context's rate, usually 48 kHz) into 20 ms frames of 24 kHz mono PCM16, the
// format the page asks for in session.update, and posts each frame's bytes to the page.
//
// Resampling is linear interpolation on a running fractional position, so frames join
// without a seam; for speech into a VAD and an ASR front end that is enough (no
// anti-alias filter: above 12 kHz there is little speech energy to fold back).

const OUTPUT_RATE = 24000;
const FRAME_SAMPLES = 480; // 20 ms at 24 kHz

class CaptureProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    this.step = sampleRate / OUTPUT_RATE; // input samples per output sample
    this.position = 0; // where the next output sample falls, in input samples from `last`
    this.last = 0; // the previous block's final sample, for interpolation across blocks
    this.frame = new DataView(new ArrayBuffer(FRAME_SAMPLES * 2));
    this.filled = 0;
  }

  process(inputs) {
    const channels = inputs[0];
    if (channels.length === 0) return true; // no input connected (yet)
    const block = channels[0]; // mono: the first channel is enough for a voice demo
    // Sample i of the extended block [last, ...block] is at position i.
    while (this.position < block.length) {
      const i = Math.floor(this.position);
      const frac = this.position - i;
      const a = i === 0 ? this.last : block[i - 1];
      const b = block[i];
      this.emit(a + (b - a) * frac);
      this.position += this.step;
    }
    this.position -= block.length;
    this.last = block[block.length - 1];
    return true;
  }

  emit(sample) {
    const clipped = Math.max(-1, Math.min(1, sample));
    this.frame.setInt16(this.filled * 2, Math.round(clipped * 32767), true); // little-endian
    this.filled += 1;
    if (this.filled === FRAME_SAMPLES) {
      const bytes = this.frame.buffer;
      this.port.postMessage(bytes, [bytes]);
      this.frame = new DataView(new ArrayBuffer(FRAME_SAMPLES * 2));
      this.filled = 0;
    }
  }
}

registerProcessor("capture-worklet", CaptureProcessor);
