// Cross checks with the Python side's SEAL (driven by tests/parties/test_ts_sdk.py).
//
//   node test/tools/seal-cross.ts encrypt CONTEXT VALUES.json OUT     a chunk of VALUES under the public CONTEXT
//   node test/tools/seal-cross.ts roundtrip CONTEXT CIPHERTEXT OUT    a Python SEAL ciphertext loaded into node-seal
//                                                                     and saved again, in Python's version
import { readFileSync, writeFileSync } from 'node:fs';

import { BfvEncryptor, localVersion, seal } from '../../src/bfv.ts';
import { convertSeal, sealVersionOf } from '../../src/seal-format.ts';
import { parseContext } from '../../src/tenseal.ts';

const [cmd, contextPath, input, out] = process.argv.slice(2);
const context = new Uint8Array(readFileSync(contextPath!));
if (cmd === 'encrypt') {
  const enc = await BfvEncryptor.create(context);
  const values = (JSON.parse(readFileSync(input!, 'utf8')) as number[]).map(BigInt);
  writeFileSync(out!, enc.encryptChunk(values));
} else if (cmd === 'roundtrip') {
  const s = await seal();
  const parsed = parseContext(context);
  const mine = localVersion(s);
  const parms = new s.EncryptionParameters(s.SchemeType.bfv);
  parms.loadFromArray(convertSeal(parsed.parms, 'parms', mine));
  const ctx = new s.SEALContext(parms, true, s.SecLevelType.tc128);
  const ct = new s.Ciphertext();
  const python = new Uint8Array(readFileSync(input!));
  ct.loadFromArray(ctx, convertSeal(python, 'ciphertext', mine));
  const again = new Uint8Array(ct.saveToArray(s.ComprModeType.none));
  writeFileSync(out!, convertSeal(again, 'ciphertext', sealVersionOf(python)));
} else {
  process.stderr.write('usage: seal-cross.ts encrypt|roundtrip CONTEXT IN OUT\n');
  process.exitCode = 2;
}
