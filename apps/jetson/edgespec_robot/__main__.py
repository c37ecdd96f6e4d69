from edgespec_robot.service import main

main()
