/**
 * src/server-api.d.ts is what openapi-typescript makes of docs/server-api.yaml today: the
 * panel's types cannot drift from the schema the Python tests check the server against.
 */
import { execFileSync } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';

const root = path.resolve(__dirname, '..');
const cli = path.join(root, 'node_modules', 'openapi-typescript', 'bin', 'cli.js');
const schema = path.resolve(root, '..', 'docs', 'server-api.yaml');

/** Exit status of `openapi-typescript <schema> --output <file> --check`. */
function check(output: string): number {
  try {
    execFileSync(process.execPath, [cli, schema, '--output', output, '--check'], { cwd: root, stdio: 'pipe' });
    return 0;
  } catch (error) {
    return (error as { status: number }).status;
  }
}

describe('generated API types', () => {
  it('match docs/server-api.yaml (regenerate with `npm run api:types`)', () => {
    expect(check(path.join(root, 'src', 'server-api.d.ts'))).toBe(0);
  });

  it('are reported stale when they differ', () => {
    const stale = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'vgpu-api-')), 'server-api.d.ts');
    fs.writeFileSync(stale, fs.readFileSync(path.join(root, 'src', 'server-api.d.ts'), 'utf8').replace('AllocationCard', 'Card'));
    expect(check(stale)).not.toBe(0);
  });
});
